"""Runs one drain: draining → migrating → terminating → done.

    1. draining     readiness fails at once; a ``drain`` event is pushed to every worker
                    (both happen inside ``start()``, before anything awaits); stay at least
                    ``min_drain``.
    2. migrating    wait until every worker reports zero in-flight and every handoff is
                    acknowledged, or the migration deadline. A worker whose event stream was
                    open when the drain started holds the phase until it has reported (or
                    disconnected, or exited); one that never connected counts as drained.
    3. terminating  persist, push ``terminate`` to connected workers, wait (bounded) for their
                    ``prekill_done``, then run the ordered kill on every registered tree and
                    every adopted tree (re-discovered now), with the outcomes of a previous
                    run as ``prior`` so no process is signalled twice.
    4. done         the summary is final; every later ``GET /drain`` answers it.

A force drain (``start(force=True)``) passes through the same phases without waiting in any:
no minimum drain, no migration, no pre-kill wait, and a kill in force mode (SIGKILL to every
process at once). A force request that joins a running graceful drain escalates it: in
``draining`` or ``migrating`` the wait ends at once and the force kill follows; while the
pre-kill hooks are awaited the wait ends; while the graceful kill runs, the kill is escalated
(every process not yet ended is SIGKILLed now). A drain that is done stays as it was.

Concurrent and repeated ``start()`` calls join the running drain. ``abort()`` returns to
``serving`` before ``terminating`` and raises ``DrainConflict`` after. The controller knows the
workers only through the small ``Fleet`` protocol, and the kill engine only through ``Killer``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from coordinator.drain.budget import (
    anchor,
    effective_budget,
    remaining,
    split_budget,
)
from coordinator.drain.changes import ChangeSignal
from coordinator.drain.handover import Handover
from coordinator.drain.outcome import Verdict, judge
from coordinator.drain.phases import IllegalTransition, Move, Phase, PhaseMachine
from coordinator.drain.ports import Fleet, Killer
from coordinator.drain.record import DrainConfig, DrainRecord
from coordinator.errors import DrainConflict, RefusedTarget
from coordinator.kill.policy import KillPolicy
from coordinator.kill.report import KillReport, ProcessOutcome

log = logging.getLogger(__name__)

KILL_ATTEMPTS = 2
"""A kill that raised (a bug, never a process's fault: those are recorded per process) is
run once more, resuming from what the first attempt did."""

class DrainController:
    """Owns the drain task; see the module docstring for its steps."""

    def __init__(
        self,
        *,
        machine: PhaseMachine,
        changes: ChangeSignal,
        fleet: Fleet,
        kill: Killer,
        config: DrainConfig,
        on_outcome: Callable[[ProcessOutcome], None] | None = None,
        on_finished: Callable[[DrainRecord], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.machine = machine
        self.changes = changes
        self.fleet = fleet
        self.kill = kill
        self.config = config
        self.clock = clock
        self._on_outcome = on_outcome
        self._on_finished = on_finished
        self.drain: DrainRecord | None = None
        self.last: DrainRecord | None = None
        """The most recent drain that ended (done or aborted)."""
        self._task: asyncio.Task[None] | None = None
        self._finished = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None
        self._killing = False
        self.handover = Handover()
        """Callers that send the main processes' graceful signal themselves (``handover``)."""

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    @property
    def running(self) -> bool:
        """A drain is in progress (not serving, not done)."""
        return self.phase.draining

    # --- the operations ------------------------------------------------------------------

    def start(self, reason: str, deadline_s: float | None = None, *,
              force: bool = False) -> tuple[DrainRecord, bool]:
        """Start a drain, or join the one running (or done); returns (drain, joined).

        ``force`` skips every wait and kills with SIGKILL; joining a running drain with it
        escalates that drain (see the module docstring)."""
        if self.drain is not None and self.phase is not Phase.SERVING:
            if force and self.running and not self.drain.force:
                self._escalate(self.drain)
            return self.drain, True
        split = split_budget(
            effective_budget(self.config.budget_s, deadline_s),
            tier_timeout_s=self.config.tier_timeout_s,
            confirm_s=self.config.confirm_s,
            termination_share=self.config.termination_share,
            min_drain_s=self.config.min_drain_s,
            main_exit_s=self.config.main_exit_s,
        )
        drain = DrainRecord(reason=reason, split=split, deadlines=anchor(split, self.clock()),
                            force=force)
        self.drain = drain
        self._finished = asyncio.Event()
        self.handover.reset()
        # Readiness and the workers' push must not wait for anything: transition first,
        # then the push, then everything that may await (the task, the state file).
        self.machine.advance(Phase.DRAINING, note=reason)
        self.fleet.drain_started(drain)
        self._launch()
        self._persist_soon(drain)
        log.info("drain started (%s): budget %.1fs, migration %.1fs, termination %.1fs",
                 reason, split.total_s, split.migration_s, split.termination_s)
        return drain, False

    def _escalate(self, drain: DrainRecord) -> None:
        drain.force = True
        log.warning("drain escalated to force in %s", self.phase)
        self.machine.bump()
        self.changes.notify()  # ends the wait of draining, migrating or the pre-kill hooks
        if self._killing:
            try:
                self.kill.escalate()  # the tier waited on gets SIGKILL now, and every later one
            except Exception as exc:
                self._failed(drain, "escalating the kill", exc)
        self._persist_soon(drain)

    def _persist_soon(self, drain: DrainRecord) -> None:
        """Schedule a state write; bookkeeping that fails is recorded, never raised."""
        try:
            self.fleet.persist()
        except Exception as exc:
            self._failed(drain, "persisting the state", exc)

    def abort(self) -> DrainRecord:
        """Return to ``serving``; ``DrainConflict`` once terminating (or when not draining)."""
        if self.drain is None or self.phase is Phase.SERVING:
            raise DrainConflict("no drain is running")
        self.machine.advance(Phase.SERVING, note="aborted")  # raises past migrating
        drain = self.drain
        if self._task is not None:
            self._task.cancel()
        drain.outcome = "aborted"
        drain.ended_at = self.clock()
        self.fleet.drain_aborted()
        self._finish(drain)
        self.drain = None
        return drain

    def resume(self, drain: DrainRecord, phase: Phase) -> None:
        """Continue a drain persisted by a coordinator that was killed."""
        self.drain = drain
        if phase is Phase.DONE:
            self.last = drain
            self._finished.set()
            return
        log.info("resuming the drain in %s with %.1fs of budget left", phase,
                 remaining(drain.deadlines.deadline_at, self.clock()))
        self.fleet.drain_started(drain)
        self._launch()

    def new_cycle(self, note: str) -> DrainRecord | None:
        """End the cycle of a drain that is done: back to ``serving``, the drain kept as
        ``last`` (``IllegalTransition`` in any other phase). Returns the finished drain."""
        self.machine.advance(Phase.SERVING, note=note, move=Move.NEW_CYCLE)
        finished, self.drain = self.drain, None
        if finished is not None:
            self.last = finished
        if self._expiry is not None:  # the finished drain's budget no longer matters
            self._expiry.cancel()
            self._expiry = None
        return finished

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the current drain ends (done or aborted); False on timeout."""
        finished = self._finished
        if finished.is_set():
            return True
        try:
            await asyncio.wait_for(finished.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the drain task (the coordinator is going away without waiting)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._expiry is not None:
            self._expiry.cancel()

    # --- the drain itself -----------------------------------------------------------------

    def _launch(self) -> None:
        assert self.drain is not None
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(self.drain), name="drain")
        if self._expiry is not None:
            self._expiry.cancel()
        delay = remaining(self.drain.deadlines.deadline_at, self.clock())
        self._expiry = loop.call_later(delay, self.fleet.budget_ended)

    async def _run(self, drain: DrainRecord) -> None:
        deadlines = drain.deadlines
        try:
            # 1. draining: stay at least min_drain.
            if self.phase is Phase.DRAINING:
                await self._wait_until(deadlines.min_drain_until, lambda: drain.force)
                self.machine.advance(Phase.MIGRATING)
                self._persist_soon(drain)
            # 2. migrating: until every worker is drained and every handoff acknowledged.
            if self.phase is Phase.MIGRATING:
                await self._wait_until(
                    deadlines.migration_deadline_at,
                    lambda: drain.force or self.fleet.migration_settled())
                self.machine.advance(Phase.TERMINATING)
        except asyncio.CancelledError:
            raise
        except IllegalTransition:
            log.info("drain task stopped: the drain was aborted")
            return
        except Exception as exc:
            # Whatever failed before the kill, the engine's processes still get it.
            self._failed(drain, "before the kill", exc)
            while self.phase.before_kill:
                self.machine.advance(Phase.MIGRATING if self.phase is Phase.DRAINING
                                     else Phase.TERMINATING)
        if self.phase is not Phase.TERMINATING:
            return
        # 3. terminating: on disk first, then pre-kill hooks, then the kill. Each step of
        # bookkeeping may fail (and says so); the kill runs whatever happened before it.
        await self._guarded(drain, "persisting the state", self._persist_now)
        waiting_for: list[str] = []
        try:
            waiting_for = self.fleet.terminating(drain)
        except Exception as exc:
            self._failed(drain, "pushing terminate to the workers", exc)
        prekill_until = min(self.clock() + self.config.prekill_timeout_s,
                            deadlines.deadline_at)
        await self._guarded(drain, "waiting for the pre-kill hooks", lambda: self._wait_until(
            prekill_until, lambda: drain.force or self.fleet.prekill_settled(waiting_for)))
        report = await self._kill(drain)
        if report is not None:
            for process in report.processes:
                drain.outcomes[(process.pid, process.start_time)] = process
            drain.kill = report.to_dict(processes=False)
        # 4. done: judge what really happened.
        try:
            drain.cut_requests = self.fleet.cut_requests(drain)
        except Exception as exc:
            self._failed(drain, "counting the requests the kill cut", exc)
        try:
            drain.lost_requests = self.fleet.lost_requests(drain) + drain.cut_requests
        except Exception as exc:
            self._failed(drain, "counting lost requests", exc)
        verdict = self._judge(drain, self.config.engine_kills)
        drain.ended_at = self.clock()
        log_end = log.info if verdict.graceful else log.warning
        log_end("drain done: %s%s", verdict.outcome,
                "".join(f"\n  - {cause}" for cause in verdict.causes))
        try:
            self.machine.advance(Phase.DONE, note=verdict.outcome)
            await self._guarded(drain, "persisting the state", self._persist_now,
                                judged=True)
        finally:
            self._finish(drain)

    @staticmethod
    def _judge(drain: DrainRecord, engine_kills: str = "") -> Verdict:
        verdict = judge(list(drain.outcomes.values()), lost_requests=drain.lost_requests,
                        cut_requests=drain.cut_requests, errors=drain.errors,
                        force=drain.force, engine_kills=engine_kills)
        drain.outcome, drain.causes = verdict.outcome, list(verdict.causes)
        return verdict

    def _failed(self, drain: DrainRecord, step: str, exc: BaseException) -> None:
        """Record an internal failure on the drain; the drain goes on."""
        log.error("drain: %s failed", step, exc_info=exc)
        drain.errors.append(f"{step} failed ({type(exc).__name__}: {exc})")

    async def _guarded(self, drain: DrainRecord, step: str,
                       run: Callable[[], Awaitable[None]], *, judged: bool = False) -> None:
        """Await ``run()``; a failure is recorded (``_failed``) instead of raised. After the
        verdict (``judged``), an error changes the outcome to ``error`` if it was graceful."""
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(drain, step, exc)
            if judged:  # the verdict is already out: judge again with this error
                self._judge(drain, self.config.engine_kills)

    async def _kill(self, drain: DrainRecord) -> KillReport | None:
        """The ordered kill; never raises. A kill that fails unexpectedly is run again once,
        resuming from the outcomes recorded so far (no process is signalled twice)."""
        try:
            targets = self.fleet.kill_targets()
        except Exception as exc:
            self._failed(drain, "listing the processes to kill", exc)
            targets = []
        self._killing = True
        attempts = 0
        try:
            while True:
                prior = dict(drain.outcomes) or None
                try:
                    return await self.kill.run(targets, self._policy(drain),
                                               on_update=self._record_outcome, prior=prior,
                                               hand_roots=self.handover.take)
                except RefusedTarget as exc:
                    # Registration vetted every root; one that became protected since is
                    # dropped.
                    log.error("kill refused %s; dropping that target", exc)
                    drain.errors.append(f"kill refused pid {exc.pid}: {exc}")
                    targets = [t for t in targets if t.pid != exc.pid]
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    attempts += 1
                    self._failed(drain, f"the kill (attempt {attempts})", exc)
                    if attempts >= KILL_ATTEMPTS:
                        return None
        finally:
            self._killing = False

    def _policy(self, drain: DrainRecord) -> KillPolicy:
        left = remaining(drain.deadlines.deadline_at, self.clock())
        # Every second the migration left unused; the kill engine keeps its own reserve for
        # SIGKILL and confirmation inside this deadline.
        return KillPolicy(
            signal=self.config.kill_signal,
            tier_timeout_s=self.config.tier_timeout_s,
            deadline_s=max(0.1, left),
            confirm_s=self.config.confirm_s,
            force=drain.force,
        )

    def _record_outcome(self, outcome: ProcessOutcome) -> None:
        if self.drain is not None:
            self.drain.outcomes[(outcome.pid, outcome.start_time)] = outcome
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def _wait_until(self, deadline_at: float, done: Callable[[], bool]) -> None:
        while not done():
            left = remaining(deadline_at, self.clock())
            if left <= 0:
                return
            await self.changes.wait(left)

    async def _persist_now(self) -> None:
        pending = self.fleet.persist(now=True)
        if pending is not None:
            await pending

    def _finish(self, drain: DrainRecord) -> None:
        self.last = drain
        self._finished.set()
        if self._on_finished is not None:
            self._on_finished(drain)
