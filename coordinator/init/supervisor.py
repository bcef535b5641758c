"""The engine's init at work: its signals, its reaping, its drain, its end.

    1. RUNNING: every signal but the stop signal goes to the engine's main process, through
       its pidfd (never to a process group); every child that exits is reaped here at once,
       its status kept where the kill engine reads exit codes.
    2. The stop signal (the runtime's SIGTERM, or ``--stop-signal``) starts the drain a
       preStop hook would start: readiness off, the workers told, migration, the ordered
       kill with the engine's main process last (or first, as its profile says), within the
       budget the grace period gives. A drain an operator starts through the API is the
       same drain. A second stop signal escalates it, as uvicorn's second Ctrl-C does:
       SIGKILL to what is left, now.
    3. The main process exits (its drain's kill, or on its own: a crash, a forwarded
       SIGINT). A drain that runs is waited for.
    4. ENDING: whatever child of ours is still alive (a daemon reparented here, a process
       the drain's kill never found) gets an ordered kill of its own, SIGTERM first, within
       what is left of the budget; a second stop signal escalates it too.
    5. Every child is reaped (bounded by the SIGKILL confirmation time).
    6. DONE: the exit code is the main process's own status (0; 128 + n for a signal), and
       the summary is the last line of the log (``server.run_engine`` writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.init.engine_child import EngineChild
from coordinator.init.lifecycle import Move, State, after, describe, exit_status
from coordinator.init.reaper import Reaped, Reaper
from coordinator.kill import KillPolicy, KillReport, Target, Terminator, procfs
from coordinator.logfmt import logfmt

if TYPE_CHECKING:
    from coordinator.drain.record import DrainRecord
    from coordinator.service.runtime import Coordinator
    from coordinator.settings import Settings

log = logging.getLogger(__name__)

SAFETY_NET_S = 1.0
"""The lifecycle looks at its state at least this often; every change it acts on also wakes
it at once (a signal, a reap, a bump of ``/status``)."""
UNKNOWN_MAIN_STATUS = 128 + signal.SIGKILL
"""The exit status when the main process's own could not be learned (it outlived its
SIGKILL): what the runtime would record once this process, and with it the container, is
gone."""


@dataclass
class Summary:
    """What the engine's init did, for its last log line."""

    main_pid: int
    command: str
    main_code: int | None = None
    stop_signals: int = 0
    drain_outcome: str | None = None
    drain_reason: str | None = None
    processes: dict[str, int] = field(default_factory=dict)
    """Fates of every process a kill (the drain's, the leftovers') reported."""
    leftovers: int = 0
    reaped: int = 0
    children_left: int = 0

    @property
    def exit_code(self) -> int:
        return UNKNOWN_MAIN_STATUS if self.main_code is None else exit_status(self.main_code)

    def line(self) -> str:
        return logfmt({
            "exit_code": self.exit_code, "main_pid": self.main_pid,
            "main": describe(self.main_code), "command": self.command,
            "stop_signals": self.stop_signals, "drain": self.drain_outcome,
            "reason": self.drain_reason, **self.processes, "leftovers": self.leftovers,
            "reaped": self.reaped, "children_left": self.children_left})


class EngineInit:
    """One engine under this process; see the module docstring for the steps."""

    def __init__(self, child: EngineChild, stop_signal: int, settings: Settings) -> None:
        self.child = child
        self.stop_signal = stop_signal
        self.settings = settings
        self.state = State.RUNNING
        self.main_code: int | None = None
        self.stops = 0
        self.reaper = Reaper(self._reaped)
        self.summary = Summary(child.pid, " ".join(child.argv))
        self._wake = asyncio.Event()
        self._escalated = False
        self._leftovers = Terminator()
        self.done = asyncio.Event()

    # --- what the loop's signal handlers call (only record, then wake the lifecycle) ------

    def signal_received(self, sig: int) -> None:
        if sig == self.stop_signal:
            self.stops += 1
            log.info("%s received (%d): %s", signal.Signals(sig).name, self.stops,
                     "the drain" if self.stops == 1 else "escalating")
            self._wake.set()
            return
        delivered = self.child.send(sig)
        log.info("%s passed on to the engine's main process %d%s", signal.Signals(sig).name,
                 self.child.pid, "" if delivered else " (it has exited)")

    def reap(self) -> None:
        self.reaper.reap()

    def _reaped(self, found: Reaped) -> None:
        if found.pid == self.child.pid and self.main_code is None and (
                self.child.start_ticks is None or found.start_ticks in (
                    None, self.child.start_ticks)):
            self.main_code = found.exit_code
            self.summary.main_code = found.exit_code
            log.log(logging.INFO if found.exit_code == 0 else logging.WARNING,
                    "the engine's main process %d %s", found.pid, describe(found.exit_code))
            self.child.close()
        else:
            log.debug("reaped pid %d (%s)", found.pid, describe(found.exit_code))
        self._wake.set()

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self, coordinator: Coordinator) -> None:
        """Steps 1-6, until DONE; sets ``done``."""
        try:
            while self.state is not State.DONE:
                self._wake.clear()
                self.reap()  # a reap whose SIGCHLD is still queued counts now
                if not await self._step(coordinator):
                    await self._wait(coordinator)
        finally:
            self.summary.stop_signals = self.stops
            self.summary.reaped = self.reaper.count
            self.done.set()

    def _move(self, move: Move) -> None:
        before, self.state = self.state, after(self.state, move)
        log.info("engine init: %s -> %s (%s)", before.value, self.state.value, move.value)

    async def _step(self, coordinator: Coordinator) -> bool:
        """Act on what is known now; True when the state moved (look again at once)."""
        controller = coordinator.controller
        if self.state is State.RUNNING:
            if controller.running:
                self._move(Move.DRAIN)  # an operator's drain: waited for like our own
            elif self.main_code is not None:
                self._move(Move.MAIN_EXITED)  # step 3, no drain running
            elif self.stops:
                controller.start(f"{signal.Signals(self.stop_signal).name} to the engine's "
                                 "init")  # step 2
                self._move(Move.DRAIN)
            else:
                return False
            return True
        if self.state is State.DRAINING:
            if self.stops >= 2 and not self._escalated and controller.running:
                self._escalated = True
                controller.start("second stop signal", force=True)
            if controller.running:
                return False
            drain = controller.drain
            if drain is None or drain.outcome == "aborted":
                self.stops = 0  # the operator took the pod back: a new stop drains anew
                self._move(Move.ABORTED)
            else:
                self._record_drain(drain)
                self._move(Move.DRAIN_DONE)
            return True
        # ENDING: steps 4 and 5.
        await self._end_leftovers(self._budget_left_s(coordinator))
        await self._reap_all()
        self._move(Move.ALL_REAPED)
        return True

    async def _wait(self, coordinator: Coordinator) -> None:
        wake = asyncio.ensure_future(self._wake.wait())
        change = asyncio.ensure_future(coordinator.changes.wait(SAFETY_NET_S))
        try:
            await asyncio.wait((wake, change), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (wake, change):
                task.cancel()
            await asyncio.gather(wake, change, return_exceptions=True)

    def _record_drain(self, drain: DrainRecord) -> None:
        self.summary.drain_outcome = drain.outcome
        self.summary.drain_reason = drain.reason
        for outcome in drain.outcomes.values():
            fate = outcome.fate.value
            self.summary.processes[fate] = self.summary.processes.get(fate, 0) + 1

    # --- step 4: what is left ------------------------------------------------------------

    def _left_behind(self) -> list[Target]:
        """Every live child of ours (zombies are for the reaper), by identity."""
        me = os.getpid()
        boot = procfs.boot_time()
        return [Target(pid=s.pid, start_time=s.start_time(boot), role="left-behind")
                for s in procfs.snapshot().values() if s.ppid == me and not s.zombie]

    def _budget_left_s(self, coordinator: Coordinator) -> float:
        drain = coordinator.controller.drain
        floor = self.settings.confirm_s + 1.0
        if drain is None:
            return self.settings.tier_timeout_s + floor
        return max(floor, drain.deadlines.deadline_at - time.time())

    async def end_alone(self) -> None:
        """Without the service (it failed to start, or stopped first): end every child of
        ours, the engine included, in order, within one tier and its confirmation; reap."""
        self._wake, self.done = asyncio.Event(), asyncio.Event()  # this loop's own
        self._leftovers = Terminator()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        try:
            await self._end_leftovers(self.settings.tier_timeout_s + self.settings.confirm_s)
            await self._reap_all()
        finally:
            loop.remove_signal_handler(signal.SIGCHLD)
            self.summary.stop_signals = self.stops
            self.summary.reaped = self.reaper.count
            self.done.set()

    async def _end_leftovers(self, deadline_s: float) -> None:
        targets = self._left_behind()
        if not targets:
            return
        log.warning("ending %d process(es) left behind by the engine: %s", len(targets),
                    ", ".join(str(t.pid) for t in targets))
        policy = KillPolicy(tier_timeout_s=self.settings.tier_timeout_s, deadline_s=deadline_s,
                            confirm_s=self.settings.confirm_s, force=self.stops >= 2)
        run = asyncio.ensure_future(self._leftovers.run(targets, policy))
        while not run.done():
            self._wake.clear()
            wake = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((run, wake), return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
            self.reap()
            if self.stops >= 2:
                self._leftovers.escalate()
        report: KillReport = run.result()
        self.summary.leftovers = len(report.processes)
        for outcome in report.processes:
            fate = outcome.fate.value
            self.summary.processes[fate] = self.summary.processes.get(fate, 0) + 1
            log.log(logging.INFO if outcome.fate.graceful else logging.WARNING,
                    "left behind: %s", logfmt({
                        "pid": outcome.pid, "name": outcome.name, "fate": outcome.fate.value,
                        "exit_code": outcome.exit_code, "detail": outcome.detail or None}))

    # --- step 5: every child reaped --------------------------------------------------------

    async def _reap_all(self) -> None:
        give_up_at = time.monotonic() + max(self.settings.confirm_s, 0.1)
        while True:
            self.reap()
            if not Reaper.has_children():
                return
            left = give_up_at - time.monotonic()
            if left <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
        alive = [t.pid for t in self._left_behind()]
        self.summary.children_left = len(alive)
        log.error("%d child process(es) still running at the end: %s", len(alive),
                  ", ".join(map(str, alive)))
