"""What the worker tells the coordinator about itself, and how registration is retried."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_any,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from shutdown_wire import Tier
from worker_client.errors import CoordinatorRefused

FIRST_RETRY_S = 0.05
"""First pause between registration attempts (s). Short: the coordinator usually starts next
to the engine and is up within a fraction of a second."""
MAX_RETRY_S = 2.0
"""Longest pause between attempts (s): how late the engine may register after a coordinator
that came up late (or restarted) is reachable again."""


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


class stop_when_true(stop_base):
    """Stop retrying once ``predicate()`` is true (the client was closed)."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self.predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.predicate()


RETRY_STATUSES = frozenset({408, 429})
"""4xx answers that a later attempt can fix: the body was too slow, or a limit of the
coordinator's was reached (it says when to retry)."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (
        isinstance(exc, httpx.HTTPStatusError) and (
            exc.response.status_code >= 500 or exc.response.status_code in RETRY_STATUSES)
    )


def register(
    http: httpx.Client,
    registration: Registration,
    stop_when: Callable[[], bool],
    sleep: Callable[[float], Any],
) -> dict[str, Any]:
    """``POST /workers`` until it succeeds; retried with backoff while the coordinator is down.

    Raises CoordinatorRefused on a 4xx (retrying cannot fix it) and RuntimeError when
    ``stop_when()`` turned true before it succeeded. ``sleep`` waits between attempts (an
    event's ``wait`` makes closing the client cut the pause short).
    """
    retrying = Retrying(
        retry=retry_if_exception(_retryable),
        wait=wait_exponential_jitter(initial=FIRST_RETRY_S, max=MAX_RETRY_S, jitter=FIRST_RETRY_S),
        stop=stop_any(stop_never, stop_when_true(stop_when)),
        reraise=True,
        sleep=sleep,
    )
    for attempt in retrying:
        with attempt:
            if stop_when():
                raise RuntimeError("worker client closed before registration")
            resp = http.post("/workers", json=registration.to_json())
            if 400 <= resp.status_code < 500 and resp.status_code not in RETRY_STATUSES:
                raise CoordinatorRefused(resp.status_code, resp.text)
            resp.raise_for_status()
            data: dict[str, Any] = resp.json()
            return data
    raise RuntimeError("unreachable")  # pragma: no cover
