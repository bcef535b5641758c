"""In-flight requests of an engine that never registers, read from its own metrics.

An adopted engine (stock vLLM, SGLang, Dynamo) does not report its in-flight requests to the
coordinator, but every one of them exports them on its Prometheus endpoint (vLLM
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, SGLang
``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``). While a drain is ``draining`` or
``migrating``, ``EngineProbe`` reads that endpoint every ``INTERVAL_S`` and the migrating
phase holds until the sum of the named gauges is 0 (the engine finished what it had), or the
migration deadline. So an adopted engine's requests finish inside the migration window
instead of being cut by the kill.

    1. the first read is taken before the phase may end (``settled`` is False until then);
       the reads go on while the kill runs (``ending``), until the engine stops answering:
       the count it gave at its last answer (``last_count``) is what it still had in flight
       when it stopped, which the kill then cut (``cut``); a read that fails then ends the
       reads and leaves ``/status`` its last reading;
    2. each later read that changes the count bumps ``/status`` (``engine_inflight``);
    3. an endpoint that cannot be read or parsed counts as settled (the engine may be gone, or
       never exported the gauges): the reason is shown in ``/status`` and logged once, and the
       drain goes on;
    4. an endpoint that answers too slowly does not: an engine busy streaming answers its
       metrics late (vLLM's API server serves them from the loop that streams the tokens), so
       the last count read holds, the reason is shown, and the next read is tried; the
       migration deadline bounds the wait.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from coordinator.tls import verify_for

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

INTERVAL_S = 0.1
"""Between two reads: a finished request is noticed within this, at one small GET each."""
TIMEOUT_S = 5.0
"""One whole read at most. A read that takes longer is slow, not failed (step 4)."""
SLOW = f"not read whole within {TIMEOUT_S:g}s"
MAX_BODY_BYTES = 4 * 1024 * 1024
"""A metrics page larger than this is not read on (vLLM's is ~100 KB with histograms): the read
stops at this size, so an engine that streams without end costs this much memory, no more."""


def inflight(text: str, names: Iterable[str]) -> int | None:
    """The sum of the gauges ``names`` (every sample of each, whatever its labels) in a
    Prometheus text page; None when none of them is on the page.

    Only the lines of those gauges are parsed (their samples and their ``# TYPE``/``# HELP``
    lines, picked out by prefix). The pages are mostly histograms (vLLM's 50 KB, SGLang's
    77 KB), read 10 times a second while a drain waits: parsed whole on the loop, a read
    took 15 ms (vLLM) to 26 ms (SGLang) of CPU, a third of the coordinator's busy samples
    during a drain on a loaded node; 0.3-0.4 ms this way (``bench/probe_parse.py``)."""
    wanted = set(names)
    starts = tuple(f"{name}{end}" for name in wanted for end in ("{", " ", "\t"))
    comments = tuple(f"# {kind} {name} " for name in wanted for kind in ("TYPE", "HELP"))
    lines = [line for line in text.splitlines()
             if line.startswith(starts) or line.startswith(comments)]
    total = 0.0
    found = False
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value):
                total += sample.value
                found = True
    return max(0, round(total)) if found else None


@dataclass
class Reading:
    """What ``/status`` shows of the probe (``engine_inflight``)."""

    url: str
    count: int | None = None
    read_at: float | None = None
    error: str | None = None
    slow: bool = False
    """The last read timed out: ``count`` is the one read before it (step 4)."""

    def to_status(self) -> dict[str, Any]:
        return {"url": self.url, "inflight": self.count, "read_at": self.read_at,
                "error": self.error, "slow": self.slow}


class EngineProbe:
    """Reads one engine's in-flight gauges while a drain migrates."""

    def __init__(self, url: str, names: tuple[str, ...], on_change: Callable[[], None]) -> None:
        self.url = url
        self.names = names
        self.reading = Reading(url)
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None
        self._read_once = False
        self.last_count: int | None = None
        """The count of the last read that succeeded (a failed or slow read keeps it)."""
        self.ending = False
        """The kill runs: the engine's end is expected (step 1)."""

    @property
    def settled(self) -> bool:
        """No in-flight request left, as far as the engine's metrics tell."""
        if not self._read_once or self.reading.slow:
            return False  # steps 1 and 4
        return self.reading.error is not None or not self.reading.count

    @property
    def has_read(self) -> bool:
        """A read succeeded since the drain started: ``last_count`` is the engine's."""
        return self._read_once and self.last_count is not None

    @property
    def cut(self) -> int:
        """Requests the engine counted in flight at its last answer (step 1): once its
        processes are gone, what the kill cut."""
        return self.last_count or 0

    def start(self) -> None:
        self.stop()
        self._read_once = False
        self.last_count = None
        self.ending = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-probe")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        # Imported here, on the first drain that reads an engine: ~5 MB the coordinator does
        # not hold while it serves, nor at all when no engine metrics are configured.
        import httpx

        async with httpx.AsyncClient(timeout=TIMEOUT_S, verify=verify_for(self.url)) as http:
            while True:
                count, error = await self._read(http)
                slow = error == SLOW
                if slow:  # step 4: the last count holds
                    count = self.reading.count
                elif error is None:
                    self.last_count = count
                elif self.ending:  # step 1: the engine is going; its last answer stands
                    return
                changed = (count, error) != (self.reading.count, self.reading.error)
                if error is not None and error != self.reading.error:
                    log.warning("engine metrics at %s: %s (%s)", self.url, error,
                                "waiting on the last count read" if slow else
                                "its in-flight requests cannot be waited for")
                self.reading = Reading(self.url, count, time.time(), error, slow)
                first = not self._read_once
                self._read_once = True
                if changed or first:  # step 2
                    self._on_change()
                await asyncio.sleep(INTERVAL_S)

    async def read_now(self) -> int | None:
        """One read outside the loop (the count right before an engine's requests are
        ended, ``coordinator.service.stream_ender``); None when it fails."""
        import httpx

        async with httpx.AsyncClient(timeout=TIMEOUT_S, verify=verify_for(self.url)) as http:
            count, _ = await self._read(http)
        return count

    async def _read(self, http: httpx.AsyncClient) -> tuple[int | None, str | None]:
        import httpx

        body = bytearray()
        try:
            async with asyncio.timeout(TIMEOUT_S), http.stream("GET", self.url) as response:
                if response.status_code != 200:
                    return None, f"answered {response.status_code}"
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:
                        return None, f"page larger than {MAX_BODY_BYTES} bytes"
        except TimeoutError:
            return None, SLOW
        except httpx.HTTPError as exc:
            return None, f"not reachable ({exc.__class__.__name__}: {exc})"
        try:
            count = inflight(body.decode("utf-8", errors="replace"), self.names)
        except ValueError as exc:
            return None, f"not Prometheus text ({exc})"
        if count is None:
            return None, f"none of {', '.join(self.names)} on the page"
        return count, None
