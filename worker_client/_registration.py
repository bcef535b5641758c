"""What the worker tells the coordinator about itself, and how registration is retried."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenacity import Retrying, retry_if_exception

from shutdown_wire import Tier
from worker_client._http import Connection
from worker_client._retry import registration_retryable, registration_wait, stop_when_true
from worker_client.errors import ClientClosed, CoordinatorRefused, ProtocolError


@dataclass(frozen=True)
class Registration:
    """The body of ``POST /workers``; the process tree is the pid's descendants."""

    pid: int = field(default_factory=os.getpid)
    role: str = "worker"
    url: str | None = None
    name: str | None = None
    tiers: Sequence[Tier] = ()
    include_tree: bool = True

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pid": self.pid, "role": self.role}
        body["include_tree"] = self.include_tree
        if self.url is not None:
            body["url"] = self.url
        if self.name is not None:
            body["name"] = self.name
        start_time = process_start_time(self.pid)
        if start_time is not None:
            body["start_time"] = start_time
        if self.tiers:
            body["tiers"] = [t.to_json() for t in self.tiers]
        return body


def process_start_time(pid: int) -> float | None:
    """Start time (epoch s) as psutil computes it, read from /proc without psutil."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, StopIteration, ValueError):
        return None
    # Field 22 (starttime, clock ticks since boot) counted after the ")" that ends the name.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def register(
    http: Connection,
    registration: Registration,
    stop_when: Callable[[], bool],
    sleep: Callable[[float], Any],
) -> dict[str, Any]:
    """``POST /workers`` until it succeeds; retried with backoff while the coordinator is down.

    Raises CoordinatorRefused on an answer no later attempt can fix (``_retry``) and
    ClientClosed once ``stop_when()`` turned true before it succeeded. ``sleep`` waits
    between attempts (an event's ``wait`` makes closing the client cut the pause short).
    """
    retrying = Retrying(
        retry=retry_if_exception(registration_retryable),
        wait=registration_wait(),
        stop=stop_when_true(stop_when),
        reraise=True,
        sleep=sleep,
    )
    for attempt in retrying:
        with attempt:
            if stop_when():
                raise ClientClosed("worker client closed before registration")
            answer = http.request("POST", "/workers", registration.to_json())
            if answer.status >= 400:
                raise CoordinatorRefused(answer.status, answer.body.decode(errors="replace"))
            data = answer.json()
            if not isinstance(data, dict) or "id" not in data:
                raise ProtocolError(f"registration answered {data!r}")
            return data
    raise ClientClosed("worker client closed before registration")
