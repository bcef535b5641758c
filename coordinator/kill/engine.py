"""The ordered graceful kill, as numbered steps.

1. Refuse protected targets (PID 1, ourselves, our ancestors) before anything is signalled.
2. Enumerate the trees; open a pidfd per process, then verify its identity (start time).
3. Resume what a previous run (a restarted coordinator) had already signalled.
4. Plan the tiers of what is still unsignalled; take the first (deepest first, roots last).
5. Signal the tier (roots: unless the caller takes their signal over, ``hand_roots``); wait
   on exit events, up to the tier's timeout cut to the deadline.
6. SIGKILL the tier's stragglers and confirm they are gone.
7. Re-enumerate the trees (forks during the kill join the plan); back to 4 until no process is
   left unsignalled and no new PID appears.
8. Report each process's fate: late exit codes, survivors, pidfds closed.

Force mode replaces 4-6 with SIGKILL for everything found. A running graceful kill can be
escalated to force mode (``KillRun.escalate``, or a force call joining a ``Terminator``): the
tier being waited on is SIGKILLed at once and every later sweep is in force mode.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Iterable, Sequence

from coordinator.kill import pidfd, safety, tiers
from coordinator.kill.listed import listed_not_found, still_running
from coordinator.kill.policy import KillPolicy, Target
from coordinator.kill.report import KillReport, ProcessOutcome
from coordinator.kill.table import HandRoots, OnUpdate, PriorOutcomes, ProcessTable, Tracked
from coordinator.kill.watch import ExitWatcher

log = logging.getLogger(__name__)

MIN_CONFIRM_S = 0.05
"""A SIGKILLed process still needs a moment to die; even past the deadline we give it this
much before calling it ``survived``."""

LISTED_POLL_S = 0.05
"""How often a listed process that outlived its root is looked at again."""

ORPHAN_GRACE_S = 1.0
"""When no time is left for a tier's graceful signal, how long its processes whose main
process this kill SIGKILLed get to die with it first (``PR_SET_PDEATHSIG``: SGLang's and
vLLM's children), so a death the main process's end caused is not reported as a SIGKILL of
the coordinator's. The real SGLang's scheduler and detokenizer were still exiting 0.5 s after
their main process's SIGKILL on a loaded machine. Cut to the deadline."""

MAX_SWEEPS_PAST_DEADLINE = 3
"""Past the deadline, new forks are SIGKILLed for at most this many more sweeps, so a fork
loop cannot keep the kill running forever."""


async def terminate(
    targets: Iterable[Target],
    policy: KillPolicy | None = None,
    *,
    on_update: OnUpdate | None = None,
    prior: PriorOutcomes | None = None,
    hand_roots: HandRoots | None = None,
) -> KillReport:
    """Terminate ``targets`` and their process trees; return every process's fate.

    Raises ``coordinator.errors.RefusedTarget`` (before signalling anything) when a target is
    PID 1, the calling process or one of its ancestors. A target that does not exist, or
    whose start time no longer matches, is reported ``gone``.
    """
    return await KillRun(list(targets), policy or KillPolicy(), on_update, prior,
                         hand_roots=hand_roots).run()


class Terminator:
    """Runs one kill at a time: a call made while a kill runs joins it and gets its report.

    The joining call's own arguments are ignored: the kubelet's hooks and an operator's
    retry are at-least-once calls for the same kill. One exception: a joining call whose
    policy is in force mode escalates the running kill to force mode.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[KillReport] | None = None
        self._run: KillRun | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run(
        self,
        targets: Iterable[Target],
        policy: KillPolicy | None = None,
        *,
        on_update: OnUpdate | None = None,
        prior: PriorOutcomes | None = None,
        hand_roots: HandRoots | None = None,
    ) -> KillReport:
        """Start a kill, or join the one in progress."""
        if not self.running:
            self._run = KillRun(list(targets), policy or KillPolicy(), on_update, prior,
                                hand_roots=hand_roots)
            self._task = asyncio.ensure_future(self._run.run())
        elif policy is not None and policy.force and self._run is not None:
            self._run.escalate()
        assert self._task is not None
        # One caller being cancelled must not cancel the kill the others wait on.
        return await asyncio.shield(self._task)

    def escalate(self) -> bool:
        """Switch the running kill to force mode now; False when no kill runs."""
        if not self.running or self._run is None:
            return False
        self._run.escalate()
        return True


class KillRun:
    """One kill, from refusal checks to the report."""

    def __init__(
        self,
        targets: Sequence[Target],
        policy: KillPolicy,
        on_update: OnUpdate | None = None,
        prior: PriorOutcomes | None = None,
        *,
        use_pidfd: bool | None = None,
        hand_roots: HandRoots | None = None,
    ) -> None:
        self.targets = targets
        self.policy = policy
        self.on_update = on_update
        self.prior = prior
        self.hand_roots = hand_roots
        support = pidfd.support()
        self.use_pidfd = support.pidfd if use_pidfd is None else use_pidfd and support.pidfd
        self.report = KillReport(
            started_at=time.time(), mode="force" if policy.force else "graceful"
        )
        if self.use_pidfd:
            self.report.exit_detection = "pidfd"
            self.report.exit_codes_from = "waitid+pidfd_info" if support.exit_info else "waitid"
            if not support.exit_info:
                self.report.notes.append(
                    "exit codes of processes that are not our children are known only while "
                    f"they are zombies ({support.detail})"
                )
        else:
            self.report.exit_detection = "poll"
            self.report.exit_codes_from = "waitid"
            why = support.detail or "disabled"
            self.report.notes.append(f"pidfds unavailable ({why}): exits found by polling /proc")
        self.force = policy.force
        self._escalated = asyncio.Event()
        self.deadline_at = time.monotonic() + policy.deadline_s
        self.reserve_s = tiers.confirm_reserve(policy.deadline_s, policy.confirm_s)
        self.last_reserve_s: float | None = None
        """Seconds the main processes' tier keeps, fixed by the first plan
        (``tiers.last_tier_reserve_s``)."""
        self._kept_s = 0.0
        """What the tiers after the current one keep (cuts its SIGKILL confirmation too)."""
        self._killed_roots: set[int] = set()
        """Roots this kill SIGKILLed: their ``PR_SET_PDEATHSIG`` children die with them."""

    def escalate(self) -> None:
        """Switch to force mode now: what is waited on and everything after gets SIGKILL."""
        if self.force:
            return
        self.force = True
        self.report.mode = "force"
        self.report.notes.append("escalated to force mode while running: SIGKILL at once")
        self._escalated.set()

    async def run(self) -> KillReport:
        # Step 1: refuse protected targets before anything is signalled.
        protected = safety.check_targets(t.pid for t in self.targets)
        self.table = ProcessTable(
            self.targets,
            protected=protected,
            use_pidfd=self.use_pidfd,
            on_update=self.on_update,
            prior=self.prior,
            started_at=self.report.started_at,
        )
        self.watcher = ExitWatcher(self.table.mark_exited, use_pidfd=self.use_pidfd)
        self.table.set_watch(lambda t: self.watcher.watch(t.outcome.pid, t.fd, t.start_ticks))
        try:
            # Step 2: enumerate, open pidfds, verify identity.
            self.table.add_roots()
            self._discover()
            # Step 3: continue the tiers a previous run had started.
            await self._resume_prior()
            await self._run_tiers()
        finally:
            # Step 8: settle and report.
            self.watcher.close()
            prior_only = self.table.prior_not_found()
            listed = await self._listed_not_found(prior_only)
            self.table.finish([*prior_only, *listed])
            self.report.processes = self.table.outcomes
            self.report.notes += self.table.notes
            self.report.unwatched_roots = self.table.unwatched_roots()
            self.report.ended_at = time.time()
        return self.report

    async def _listed_not_found(self, prior_only: list[ProcessOutcome]
                                ) -> list[ProcessOutcome]:
        """What a scan listed under the roots and the kill never found; one still running
        (a child its dead root's PR_SET_PDEATHSIG is ending) gets the SIGKILL confirmation
        time to end before it is called ``survived``."""
        give_up_at = time.monotonic() + max(MIN_CONFIRM_S, self.policy.confirm_s)
        while True:
            listed = listed_not_found(self.targets, [*self.table.outcomes, *prior_only],
                                      self.table.spared)
            if not still_running(listed) or time.monotonic() >= give_up_at:
                return listed
            await asyncio.sleep(LISTED_POLL_S)

    async def _run_tiers(self) -> None:
        sweeps_past_deadline = 0
        while True:
            pending = self.table.unsignalled()
            if not pending:
                # Step 7: done only when a fresh enumeration finds nothing new either.
                if not self._discover():
                    return
                continue
            self._kept_s = 0.0
            if self.force:
                await self._kill(pending, "force", "force mode: SIGKILL only")
            elif time.monotonic() >= self.deadline_at:
                sweeps_past_deadline += 1
                await self._kill(pending, "deadline", "found after the deadline")
                if sweeps_past_deadline >= MAX_SWEEPS_PAST_DEADLINE:
                    return
            else:
                # Step 4: the first tier of what is left; the later ones up to the main
                # processes' tier keep their share (what comes after it keeps nothing).
                plan = self._plan(pending)
                main = tiers.main_tier_index(plan)
                if self.last_reserve_s is None:
                    self.last_reserve_s = tiers.last_tier_reserve_s(
                        usable_s=self.policy.deadline_s - self.reserve_s,
                        last_timeout_s=plan[main].timeout_s)
                await self._run_tier(plan[0], [t.timeout_s for t in plan[1:main + 1]])
            self._discover()

    def _discover(self) -> list[int]:
        """One discovery pass; a failing pass (out of file descriptors, an unreadable
        ``/proc``) is noted and the kill goes on with the processes already known."""
        try:
            return self.table.discover()
        except Exception as exc:
            log.exception("process discovery failed")
            note = f"process discovery failed ({type(exc).__name__}: {exc})"
            if note not in self.report.notes:
                self.report.notes.append(note)
            return []

    def _plan(self, members: Iterable[Tracked]) -> list[tiers.PlannedTier]:
        specs = {t.pid: (*t.tiers, *self.policy.extra_tiers) for t in self.targets}
        return tiers.plan_tiers(
            [m.member for m in members],
            specs,
            default_signal=self.policy.signal,
            default_timeout_s=self.policy.tier_timeout_s,
        )

    async def _run_tier(self, tier: tiers.PlannedTier, later_timeouts: list[float]) -> None:
        members = [self.table.live[pid] for pid in tier.pids]
        now = time.monotonic()
        last_reserve_s = self.last_reserve_s or 0.0
        wait_s = tiers.allotted_wait_s(
            now=now,
            tier_started_at=now,
            timeout_s=tier.timeout_s,
            deadline_at=self.deadline_at,
            reserve_s=self.reserve_s,
            later_timeouts=later_timeouts,
            last_reserve_s=last_reserve_s,
        )
        self._kept_s = tiers.kept_for_later_s(
            left_s=self.deadline_at - self.reserve_s - now, later_timeouts=later_timeouts,
            last_reserve_s=last_reserve_s)
        if wait_s <= 0:
            orphaned = {t.outcome.pid for t in members
                        if t.outcome.root_pid in self._killed_roots and not t.exited}
            if orphaned:  # they may be dying with their main process already
                grace = min(ORPHAN_GRACE_S, self.deadline_at - time.monotonic())
                await self.watcher.wait(orphaned, max(0.0, grace))
                members = [t for t in members if not t.exited]
            await self._kill(members, tier.name, "no time left for a graceful exit")
            return
        # Step 5: signal, then wait on exit events until the SIGKILL time each process was
        # told (``kill_at``): the wait is counted from before the first signal.
        kill_at = time.time() + wait_s
        # Roots: unless the caller of the kill takes their signal over (``hand_roots``).
        roots = [t.outcome.pid for t in members if t.outcome.pid in self.table.targets]
        left = self.hand_roots(roots) if roots and self.hand_roots is not None else None
        for t, (_, sig) in zip(members, tier.signals, strict=True):
            if left is not None and t.outcome.pid in roots:
                self.table.leave_signal(t, sig, tier.name, left, kill_at)
            else:
                self.table.signal_graceful(t, sig, tier.name, kill_at)
        if await self._wait_unless_escalated(set(tier.pids), now + wait_s - time.monotonic()):
            return
        # Step 6: SIGKILL stragglers, confirm.
        stragglers = [t for t in members if not t.exited]
        sig_name = signal.Signals(tier.signals[0][1]).name
        why = f"still running {wait_s:.3g}s after {sig_name}"
        if self.force:
            why = f"force mode after {sig_name}: SIGKILL at once"
        # Whose signal it was stays in a root's reason: the caller's may never have come.
        left_why = (f"{why}; its {sig_name} was left to the caller of the drain, which may "
                    "not have sent it")
        await self._kill(stragglers, tier.name, why,
                         {pid: left_why for pid in roots} if left is not None else None)

    async def _wait_unless_escalated(self, pids: set[int], timeout_s: float) -> bool:
        """``watcher.wait``, cut short (False) when the run is escalated to force mode."""
        if self.force:
            return await self.watcher.wait(pids, 0)
        exits = asyncio.ensure_future(self.watcher.wait(pids, timeout_s))
        escalated = asyncio.ensure_future(self._escalated.wait())
        try:
            await asyncio.wait((exits, escalated), return_when=asyncio.FIRST_COMPLETED)
        finally:
            escalated.cancel()
        if not exits.done():
            exits.cancel()
            await asyncio.gather(exits, return_exceptions=True)
            return False
        return exits.result()

    async def _kill(self, members: Sequence[Tracked], tier: str, why: str,
                    whys: dict[int, str] | None = None) -> None:
        for t in members:
            self.table.sigkill(t, tier, (whys or {}).get(t.outcome.pid, why))
            if t.outcome.pid in self.table.targets:
                self._killed_roots.add(t.outcome.pid)
        confirm_s = tiers.confirm_wait_s(
            now=time.monotonic(), deadline_at=self.deadline_at, confirm_s=self.policy.confirm_s,
            kept_s=self._kept_s,
        )
        await self.watcher.wait({t.outcome.pid for t in members}, max(confirm_s, MIN_CONFIRM_S))

    async def _resume_prior(self) -> None:
        """Processes a previous run signalled keep their tier's clock; none is signalled twice."""
        resumed = [t for t in self.table.live.values() if t.signalled and not t.exited]
        if not resumed:
            return
        self.table.notes.append(
            f"resumed {len(resumed)} process(es) signalled by a previous run"
        )
        for tier in self._plan(resumed):
            members = [self.table.live[pid] for pid in tier.pids]
            killed = [t for t in members if t.outcome.killed_at is not None]
            if killed:
                await self._kill(killed, tier.name, "SIGKILLed by a previous run")
            waiting = [t for t in members if t.outcome.killed_at is None]
            if not waiting:
                continue
            first = min(t.outcome.signalled_at or time.time() for t in waiting)
            now = time.monotonic()
            wait_s = tiers.allotted_wait_s(
                now=now,
                tier_started_at=now - (time.time() - first),
                timeout_s=tier.timeout_s,
                deadline_at=self.deadline_at,
                reserve_s=self.reserve_s,
            )
            kill_at = time.time() + wait_s
            for t in waiting:
                self.table.reschedule_kill(t, kill_at)
            if not await self.watcher.wait({t.outcome.pid for t in waiting}, wait_s):
                stragglers = [t for t in waiting if not t.exited]
                await self._kill(stragglers, tier.name, "outlived its tier across a restart")
