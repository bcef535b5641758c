"""The process scan: every registered and adopted tree as ``/status`` lists it while no kill
runs.

``ProcessScan`` re-discovers the adopted roots and re-lists the trees (in a thread: reading
``/proc`` blocks) at start-up, after each registration and every ``--scan-interval`` seconds,
and keeps the last listing: ``/status`` shows it, and the drain's kill takes from it the
last-known descendants of workers whose root already exited.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from coordinator.kill.report import ProcessOutcome
from coordinator.service import adoption, identity

log = logging.getLogger(__name__)

Roots = list[tuple[int, str]]
"""(PID, role) of each registered worker's root."""


def process_entry(o: ProcessOutcome) -> dict[str, Any]:
    """A process as ``/status`` lists it (the outcome without its long command line)."""
    return {"pid": o.pid, "name": o.name, "role": o.role, "root_pid": o.root_pid,
            "parent_pid": o.parent_pid, "depth": o.depth, "fate": o.fate.value,
            "exit_code": o.exit_code, "signal": o.signal, "tier": o.tier,
            "elapsed_ms": o.elapsed_ms, "detail": o.detail,
            "signalled_at": o.signalled_at, "killed_at": o.killed_at, "ended_at": o.ended_at}


class ProcessScan:
    """The adopted roots and every process of the registered and adopted trees, as last
    listed; single event loop, no locks."""

    def __init__(self, rules: adoption.AdoptionRules, on_change: Callable[[], None]) -> None:
        self.rules = rules
        self.adopted: list[identity.ProcessFacts] = []
        self.scanned: dict[int, ProcessOutcome] = {}
        self._on_change = on_change
        """Called when the set of adopted roots or of listed processes changed."""
        self._task: asyncio.Task[None] | None = None

    async def rescan(self, roots: Roots) -> None:
        """Re-discover adopted roots and re-list every registered and adopted tree."""
        registered = [pid for pid, _ in roots]
        adopted, scanned = await asyncio.to_thread(self._scan, roots, registered)
        changed = ({f.pid for f in adopted} != {f.pid for f in self.adopted}
                   or scanned.keys() != self.scanned.keys())
        self.adopted = adopted
        self.scanned = scanned
        if changed:
            self._on_change()

    def _scan(self, roots: Roots, registered: list[int],
              ) -> tuple[list[identity.ProcessFacts], dict[int, ProcessOutcome]]:
        adopted = adoption.discover(self.rules, exclude=registered)
        scanned: dict[int, ProcessOutcome] = {}
        for root_pid, role in [*roots, *((f.pid, "adopted") for f in adopted)]:
            for found, depth in identity.tree(root_pid):
                scanned.setdefault(found.pid, ProcessOutcome(
                    pid=found.pid, name=found.name, start_time=found.start_time,
                    cmdline=found.cmdline, root_pid=root_pid, parent_pid=found.ppid,
                    depth=depth, role=role if depth == 0 else None))
        return adopted, scanned

    def forget_root(self, root_pid: int) -> None:
        """Drop the processes listed under ``root_pid`` (its worker deregistered)."""
        self.scanned = {p: o for p, o in self.scanned.items() if o.root_pid != root_pid}

    def start(self, interval_s: float, roots: Callable[[], Roots],
              paused: Callable[[], bool]) -> None:
        """Rescan every ``interval_s`` seconds, except while ``paused()`` (a kill runs)."""
        self._task = asyncio.get_running_loop().create_task(
            self._scan_forever(interval_s, roots, paused))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _scan_forever(self, interval_s: float, roots: Callable[[], Roots],
                            paused: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if paused():
                continue
            try:
                await self.rescan(roots())
            except Exception:
                log.exception("process scan failed")
