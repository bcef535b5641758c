"""``--end-streams``: the drain ends a stock engine's streams for the proxy in front to continue.

Runs ``coordinator.drain.ending``'s step against the real engine and routers (the module
docstring there has the states and why):

    1. started with the drain (``drain_started``), it waits for the migrating phase (the
       minimum drain is over) and for every router adapter to have settled its removal;
    2. reads the engine's in-flight count once more (the routers send it nothing new now),
       then ``POST``s the profile's call to ``--engine-url`` (one attempt, ``CALL_TIMEOUT_S``,
       never past the migration deadline): a 2xx means the engine ended its streams; an
       engine whose answer counts what it ended (vLLM's ``aborted``) raises the count to it;
    3. keeps the window for the proxy's acknowledgements (``acknowledge``, from ``POST
       /migrations/ack`` ``continued``) open until all are in or the window's time is over;
    4. every change bumps ``/status`` (``stream_ending``), which the proxy long-polls.

An abort (``DELETE /drain``) cancels the task; a call already answered cannot be undone: the
streams it ended were ended, and the proxy continued them on another pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from coordinator.drain.ending import EndingState, StreamEnding
from coordinator.drain.phases import Phase
from coordinator.tls import verify_for

if TYPE_CHECKING:
    from coordinator.engines import StreamEnder
    from coordinator.service.runtime import Coordinator

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
"""The engine's answer to its abort call at most: both engines answer once the abort is
dispatched, in milliseconds."""
SETTLED_ROUTERS = frozenset({"removed", "failed", "watching"})
"""States of a router whose removal is over (``coordinator.service.router_adapters``)."""


class StreamEnderTask:
    """The step of one coordinator; ``ending`` is the current (or last) drain's."""

    def __init__(self, coordinator: Coordinator, ender: StreamEnder, engine_url: str) -> None:
        self.coordinator = coordinator
        self.ender = ender
        self.url = engine_url.rstrip("/") + ender.path
        self.ending: StreamEnding | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def settled(self) -> bool:
        return self.ending is None or self.ending.settled

    def drain_started(self) -> None:
        self.stop()
        self.ending = StreamEnding()
        self._task = asyncio.get_running_loop().create_task(self._run(self.ending),
                                                            name="stream-ending")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def acknowledge(self, request_ids: list[str]) -> tuple[list[str], list[str]]:
        """The proxy took these streams over (step 3): (taken, refused)."""
        if self.ending is None:
            return [], list(dict.fromkeys(request_ids))
        taken, refused = self.ending.acknowledge(request_ids, time.time())
        if taken:
            self.coordinator.metrics.streams_ended.labels("continued").inc(len(taken))
            log.info("the proxy took over %d ended stream(s): %s", len(taken), ", ".join(taken))
        self.coordinator.bump()
        return taken, refused

    def to_status(self) -> dict[str, Any] | None:
        return None if self.ending is None else self.ending.to_status()

    async def _wait(self, ready: Any, deadline_at: float) -> bool:
        c = self.coordinator
        while not ready():
            left = deadline_at - time.time()
            if left <= 0:
                return False
            await c.changes.wait(left)
        return True

    def _routers_settled(self) -> bool:
        routers = self.coordinator.routers
        return routers is None or all(s.action == "remove" and s.state in SETTLED_ROUTERS
                                      for s in routers.states)

    async def _run(self, ending: StreamEnding) -> None:
        c = self.coordinator
        drain = c.controller.drain
        if drain is None:
            return
        deadline_at = drain.deadlines.migration_deadline_at
        try:
            # 1. the migrating phase, the routers.
            if not await self._wait(lambda: c.machine.phase is not Phase.DRAINING
                                    and self._routers_settled(), deadline_at):
                ending.router_kept("the routers did not settle before the migration deadline")
                return
            if c.machine.phase is not Phase.MIGRATING:
                return  # aborted, or forced past the migration
            kept = [f"{s.kind} {s.url}: {s.error or s.state}" for s in
                    (c.routers.states if c.routers is not None else ())
                    if s.state == "failed"]
            if kept:
                ending.router_kept("still sent work by " + "; ".join(kept))
                log.warning("streams not ended: a router did not take the pod out (%s); they "
                            "are waited for", "; ".join(kept))
                return
            # 2. the engine's count (read now: the routers send it nothing new), its call.
            probe = c.engine_probe
            if probe is None or not await self._wait(lambda: probe.has_read, deadline_at):
                ending.routers_out(None, time.time())
                return
            count = await probe.read_now()
            if not ending.routers_out(probe.last_count if count is None else count,
                                      time.time()):
                return
            c.bump()
            ok, note, told = await self._call(deadline_at)
            if told is not None and told > (ending.count or 0):
                ending.count = told  # what arrived between the read and the call
            ending.answered(ok, note, time.time(), deadline_at)
            c.metrics.streams_ended.labels("ended" if ok else "failed").inc(
                (ending.count or 0) if ok else 1)
            (log.info if ok else log.warning)(
                "ending the engine's %d stream(s) for the proxy (%s): %s",
                ending.count or 0, self.url, note)
            c.bump()
            # 3. the window.
            while True:
                ending.tick(time.time())
                if not ending.open:
                    break
                await c.changes.wait(max(0.0, (ending.window_until or 0) - time.time()))
            c.bump()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never into the drain
            log.exception("ending the engine's streams failed")
            if ending.state is EndingState.ENDING:
                ending.answered(False, f"{type(exc).__name__}: {exc}", time.time(),
                                deadline_at)
            c.bump()

    async def _call(self, deadline_at: float) -> tuple[bool, str, int | None]:
        """(ended, what the engine answered, how many it says it ended when it says)."""
        import httpx

        timeout = max(0.1, min(CALL_TIMEOUT_S, deadline_at - time.time()))
        try:
            async with httpx.AsyncClient(timeout=timeout, verify=verify_for(self.url)) as http:
                response = await http.post(self.url, content=self.ender.body,
                                           headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            return False, f"not reachable ({type(exc).__name__}: {exc})", None
        text = f"POST {self.ender.path} answered {response.status_code}"
        if not response.is_success:
            needs = f"; the call needs {self.ender.needs}" if self.ender.needs else ""
            return False, f"{text}: {response.text[:200]}{needs}", None
        told = None
        if self.ender.answer_count is not None:
            try:
                value = response.json().get(self.ender.answer_count)
            except (ValueError, AttributeError):
                value = None
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                told = value
                text += f" ({self.ender.answer_count} {value})"
        return True, text, told
