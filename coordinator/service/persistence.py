"""The coordinator's state file: what it writes, what it does with the file it finds at
start-up, and when a finished drain's cycle ends.

At start-up (``load``) the file is restored whole or not at all: one that cannot be read,
parsed, validated or turned into objects is set aside (``<path>.corrupt-<UTC time>``) and the
coordinator starts fresh, serving. A drain in progress is resumed. A drain that is done ends
its cycle when none of its processes still runs (same PID and start time; only those it
left ``survived``, or a registered worker a failed kill did not list, can): the coordinator
serves again and shows the drain as ``last_drain``.
While some still run, it stays ``done`` (its summary is still the truth about the pod) until
a new worker registers.

A worker registering while the drain is done (``admit``) starts the next cycle even when
processes of the finished drain still run: the new engine is what the host runs now, and
refusing it would leave it undrainable (``worker_client`` gives up on a 4xx). The ones still
running are named in the log and in the timeline's note, keep their fate in ``last_drain``'s
summary, and are not part of the next drain. A process of the finished drain registering
itself is refused (409).

Write failures never reach the drain: ``/status`` ``state_file`` and the metrics show them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.drain.phases import Phase
from coordinator.drain.state_file import StateWriter, load_state, set_aside
from coordinator.errors import DrainConflict
from coordinator.kill.identity import ProcessFacts, same_start
from coordinator.kill.report import ProcessOutcome
from coordinator.service.restore import RestoredState, build, still_running

if TYPE_CHECKING:
    from coordinator.service.runtime import Coordinator

log = logging.getLogger(__name__)

TIMELINE_KEPT = 64
"""Timeline entries kept in the state file (and in ``/status``)."""


class StateKeeper:
    """The state file of one ``Coordinator``: writer, start-up restore, cycle ends."""

    def __init__(self, coordinator: Coordinator, path: Path | None) -> None:
        self.coordinator = coordinator
        self.writer = StateWriter(path, self.snapshot, on_result=self._written)
        self._write_ok = True
        self._dropped: set[str] = set()
        self.loaded: dict[str, Any] = {"result": "none", "phase": None, "problem": None,
                                       "moved_to": None}
        """What the file held at start-up: ``result`` is ``none`` (no file, or none
        configured), ``restored`` (``phase`` says in which phase), ``set_aside`` (unusable,
        moved to ``moved_to``) or ``unusable`` (could not even be moved)."""

    def status(self) -> dict[str, Any]:
        """``/status`` ``state_file``: the path, how the writes went, what was loaded."""
        return {**self.writer.status(), "loaded": dict(self.loaded)}

    def snapshot(self) -> dict[str, Any]:
        """The state file's document (``version`` is added by the writer)."""
        c = self.coordinator
        controller = c.controller
        return {
            "saved_at": time.time(),
            "coordinator_pid": os.getpid(),
            "phase": c.machine.phase.value,
            "generation": c.machine.generation,
            "timeline": [t.to_dict() for t in c.machine.timeline[-TIMELINE_KEPT:]],
            "drain": controller.drain.to_record() if controller.drain else None,
            "last": controller.last.to_record() if controller.last else None,
            "workers": [w.to_record() for w in c.registry.workers.values()],
            "migrations": c.migrations.to_record(),
            **({"group": c.group.to_record()} if c.group is not None else {}),
        }

    def _written(self, ok: bool) -> None:
        metrics = self.coordinator.metrics
        (metrics.state_writes if ok else metrics.state_write_failures).inc()
        dropped = set(self.writer.dropped)
        if ok != self._write_ok or dropped != self._dropped:
            # Failing, writing again, or leaving out something else to fit: /status shows it
            # from the next generation. (Each write is not a change: it would wake every
            # long-poll.)
            self._write_ok = ok
            self._dropped = dropped
            self.coordinator.bump()

    async def load(self, path: Path) -> None:
        """Restore the file whole, or set it aside and start fresh; never raises."""
        loaded = await asyncio.to_thread(load_state, path)
        problem, moved = loaded.problem, loaded.moved_to
        state: RestoredState | None = None
        if loaded.document is not None:
            try:
                state = build(loaded.document)
            except Exception as exc:  # valid JSON an object refused: corrupt all the same
                problem = f"cannot be restored ({type(exc).__name__}: {exc})"
                moved = await asyncio.to_thread(set_aside, path, problem)
        if problem is not None:
            self.coordinator.metrics.state_files_unusable.inc()
            self.loaded.update(result="set_aside" if moved else "unusable", problem=problem,
                               moved_to=str(moved) if moved else None)
            return
        if state is None:
            return
        self.coordinator.apply_restored(state)
        self.loaded.update(result="restored", phase=state.phase.value)
        if loaded.document is not None and isinstance(loaded.document.get("dropped"), dict):
            # The writer left these out to fit what a reader accepts (state_bounds).
            self.loaded["dropped"] = dict(loaded.document["dropped"])
        if state.notes:
            self.loaded["notes"] = list(state.notes)
            for note in state.notes:
                log.warning("state file %s: %s", path, note)
        if state.phase is Phase.DONE and state.drain is not None:
            running = await asyncio.to_thread(still_running, state.drain)
            running += self._workers_alive(running)
            if running:
                log.warning("the restored drain is done but %d of its processes still run "
                            "(pids %s): staying done until a new worker registers",
                            len(running), pids(running))
            else:
                self.coordinator.new_cycle("restart",
                                           "restarted; the done drain's processes are gone")

    def left_running(self) -> list[ProcessOutcome]:
        """What the finished drain left running: processes it reported ``survived`` that
        still exist (reads ``/proc``), and registered workers whose process is still the one
        that registered (a kill that failed may not have listed them)."""
        drain = self.coordinator.controller.drain
        running = still_running(drain) if drain is not None else []
        return running + self._workers_alive(running)

    def _workers_alive(self, listed: list[ProcessOutcome]) -> list[ProcessOutcome]:
        known = {o.pid for o in listed}
        return [ProcessOutcome(pid=w.pid, name=w.name, start_time=w.start_time, role=w.role)
                for w in self.coordinator.registry.alive() if w.pid not in known]

    def admit(self, found: ProcessFacts) -> None:
        """A worker registers while the drain is done: start the next cycle (see the
        module docstring), or ``DrainConflict`` when it is one of the drain's processes."""
        running = self.left_running()
        for outcome in running:
            if outcome.pid == found.pid and same_start(outcome.start_time, found.start_time):
                raise DrainConflict(
                    f"pid {found.pid} was in the finished drain ({outcome.fate}) and still "
                    "runs: it cannot register for the next cycle")
        note = f"new cycle: pid {found.pid} registered"
        if running:
            note += f"; still running from the last drain: pids {pids(running)}"
            log.warning("%s", note)
        self.coordinator.new_cycle("registration", note)


def pids(outcomes: list[ProcessOutcome]) -> str:
    """The PIDs of ``outcomes`` for a log line (the first 20)."""
    shown = ", ".join(str(o.pid) for o in outcomes[:20])
    return shown + (f" and {len(outcomes) - 20} more" if len(outcomes) > 20 else "")
