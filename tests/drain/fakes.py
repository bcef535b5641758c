"""Fakes that drive ``DrainController`` without real time, real workers or real processes.

    ManualClock   the only clock: the controller, its phase machine and every fake read it.
    FakeChanges   a ``ChangeSignal`` whose ``wait`` advances the clock instead of sleeping, or
                  parks (in the phases a test names) until ``notify()``.
    FakeFleet     the ``Fleet`` protocol, scripted per method, recording every call.
    FakeKill      a ``Killer`` that plays one scripted step per run (report, raise, block), and
                  records each escalation (or plays a scripted one).
    Harness       all of the above wired to one controller.

Nothing here turns the event loop a number of times and hopes: ``Harness.until`` waits on
the harness's ``activity`` event, which every fake sets after each call it records (and a
change wait when it parks), and ``settle`` waits until every other task has ended, after
which nothing scheduled can still act (so "nothing was killed" is conclusive).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from coordinator.drain.changes import ChangeSignal
from coordinator.drain.controller import DrainController
from coordinator.drain.phases import Phase, PhaseMachine
from coordinator.drain.record import DrainConfig, DrainRecord, OutcomeKey
from coordinator.kill.policy import KillPolicy, Target
from coordinator.kill.report import Fate, KillReport, ProcessOutcome
from coordinator.kill.table import PriorOutcomes

T0 = 1_000_000.0
"""Epoch seconds every manual clock starts at."""

BOUND_S = 10.0
"""Real seconds ``until`` and ``settle`` allow before they fail (a passing test never waits:
the fakes need no real time)."""


class ManualClock:
    """Epoch seconds that move only when a test (or a fake) says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.now += seconds


async def wait_until(activity: asyncio.Event, condition: Callable[[], bool],
                     what: str = "the condition") -> None:
    """Return once ``condition()`` holds, checking it again each time ``activity`` is set."""
    try:
        async with asyncio.timeout(BOUND_S):
            while not condition():
                activity.clear()
                await activity.wait()
    except TimeoutError:
        raise AssertionError(f"{what} never held") from None


async def settle() -> None:
    """Wait until every other task on the loop has ended, and every task those started."""
    me = asyncio.current_task()
    try:
        async with asyncio.timeout(BOUND_S):
            while others := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
                await asyncio.wait(others)
    except TimeoutError:
        raise AssertionError(f"tasks still running: {asyncio.all_tasks()}") from None


def _poke(activity: asyncio.Event | None) -> None:
    if activity is not None:
        activity.set()


# --- the change signal ----------------------------------------------------------------------


class FakeChanges(ChangeSignal):
    """``wait(timeout)`` records ``(phase, timeout)``; then, unless the current phase is in
    ``hold_in``, advances the clock by ``min(timeout, step_s)`` and returns at once (True when
    it stopped short of the timeout: a change came). In a held phase it parks until
    ``notify()``. ``fail`` makes it raise instead."""

    def __init__(self, clock: ManualClock, machine: PhaseMachine,
                 activity: asyncio.Event | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.machine = machine
        self.activity = activity
        self.hold_in: set[Phase] = set()
        self.step_s = math.inf
        self.fail: Exception | None = None
        self.waits: list[tuple[Phase, float]] = []
        self.notified = 0
        self._held: set[asyncio.Future[bool]] = set()

    @property
    def held(self) -> int:
        """How many waits are parked now."""
        return len(self._held)

    def notify(self) -> None:
        self.notified += 1
        super().notify()
        held, self._held = self._held, set()
        for fut in held:
            if not fut.done():
                fut.set_result(True)
        _poke(self.activity)

    def release(self) -> None:
        """Stop holding in any phase and wake what is parked."""
        self.hold_in.clear()
        self.notify()

    async def wait(self, timeout_s: float) -> bool:
        phase = self.machine.phase
        self.waits.append((phase, timeout_s))
        if self.fail is not None:
            raise self.fail
        if phase in self.hold_in:
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._held.add(fut)
            _poke(self.activity)
            try:
                return await fut
            finally:
                self._held.discard(fut)
        step = min(timeout_s, self.step_s)
        self.clock.advance(step)
        # Not a barrier: a real wait suspends the drain task, so the fake does too (or a
        # drain looping over waits would never let the test's own task run).
        await asyncio.sleep(0)
        return step < timeout_s


# --- the fleet ------------------------------------------------------------------------------

PersistFailure = Literal["raise", "await"]
"""``raise``: ``persist`` itself raises; ``await``: it returns an awaitable that raises (only
meaningful for ``now=True``, the only call whose result the controller awaits)."""


@dataclass
class FakeFleet:
    """The ``Fleet`` protocol. Every call is recorded in ``calls`` as ``(name, argument)``;
    ``failing`` names methods that raise ``RuntimeError``; ``persist_failures`` maps a
    ``persist`` call's number (1-based) to how it fails."""

    targets: list[Target] = field(default_factory=lambda: [Target(100, start_time=1.0)])
    settled: Callable[[], bool] = lambda: True
    prekill: Callable[[list[str]], bool] = lambda ids: True
    prekill_ids: list[str] = field(default_factory=lambda: ["w1"])
    lost: int = 0
    cut: int = 0
    """What ``cut_requests`` answers: requests an adopted engine still had in flight."""
    failing: set[str] = field(default_factory=set)
    persist_failures: dict[int, PersistFailure] = field(default_factory=dict)
    flushes: bool = True
    """False: ``persist(now=True)`` saves synchronously and returns None."""
    hooks: dict[str, Callable[[], object]] = field(default_factory=dict)
    """Run inside the named method before it answers (e.g. an abort racing a check)."""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    persist_count: int = 0
    activity: asyncio.Event | None = None
    """Set after every call (the harness gives its own)."""

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def count(self, name: str) -> int:
        return self.names().count(name)

    def _enter(self, name: str, argument: Any = None) -> None:
        self.calls.append((name, argument))
        try:
            hook = self.hooks.get(name)
            if hook is not None:
                hook()
            if name in self.failing:
                raise RuntimeError(f"{name} broke")
        finally:
            _poke(self.activity)

    def drain_started(self, drain: DrainRecord) -> None:
        self._enter("drain_started", drain)

    def drain_aborted(self) -> None:
        self._enter("drain_aborted")

    def terminating(self, drain: DrainRecord) -> list[str]:
        self._enter("terminating", drain)
        return list(self.prekill_ids)

    def migration_settled(self) -> bool:
        self._enter("migration_settled")
        return self.settled()

    def prekill_settled(self, worker_ids: list[str]) -> bool:
        self._enter("prekill_settled", list(worker_ids))
        return self.prekill(worker_ids)

    def kill_targets(self) -> list[Target]:
        self._enter("kill_targets")
        return list(self.targets)

    def budget_ended(self) -> None:
        self._enter("budget_ended")

    def lost_requests(self, drain: DrainRecord) -> int:
        self._enter("lost_requests", drain)
        return self.lost

    def cut_requests(self, drain: DrainRecord) -> int:
        self._enter("cut_requests", drain)
        return self.cut

    def persist(self, now: bool = False) -> Awaitable[None] | None:
        self.persist_count += 1
        self._enter("persist", now)
        failure = self.persist_failures.get(self.persist_count)
        if failure == "raise":
            raise OSError(f"state file write {self.persist_count} failed")
        if not now or not self.flushes:
            return None
        return self._written(failure == "await", self.persist_count)

    async def _written(self, fail: bool, number: int) -> None:
        # Not a barrier: a real flush suspends its awaiter (a write off the loop), so this does.
        await asyncio.sleep(0)
        if fail:
            raise OSError(f"state file flush {number} failed")


def settles_after(checks: int) -> Callable[[], bool]:
    """A ``migration_settled`` that answers False ``checks`` times, then True."""
    answers = itertools.chain(itertools.repeat(False, checks), itertools.repeat(True))
    return lambda: next(answers)


# --- the kill -------------------------------------------------------------------------------


@dataclass
class KillCall:
    """One call of the kill function, as the controller made it."""

    targets: list[Target]
    policy: KillPolicy
    prior: dict[OutcomeKey, ProcessOutcome] | None
    at: float
    on_update: Callable[[ProcessOutcome], None]


Step = Callable[[KillCall], Awaitable[KillReport]]
"""What one call of the fake kill does."""


def reports(*processes: ProcessOutcome, updates: Iterable[ProcessOutcome] = ()) -> Step:
    """Call ``on_update`` with each of ``updates``, then return a report of ``processes``."""
    sent = list(updates)

    async def step(call: KillCall) -> KillReport:
        for process in sent:
            call.on_update(process)
        return KillReport(started_at=call.at, ended_at=call.at,
                          mode="force" if call.policy.force else "graceful",
                          processes=list(processes))

    return step


def raises(exc: Exception, updates: Iterable[ProcessOutcome] = ()) -> Step:
    """Call ``on_update`` with each of ``updates``, then raise ``exc``."""
    sent = list(updates)

    async def step(call: KillCall) -> KillReport:
        for process in sent:
            call.on_update(process)
        raise exc

    return step


def blocks(release: asyncio.Event, then: Step) -> Step:
    """Park until ``release`` is set, then do what ``then`` does."""

    async def step(call: KillCall) -> KillReport:
        await release.wait()
        return await then(call)

    return step


class FakeKill:
    """A ``Killer``: each run takes the next of ``steps`` (``default`` once they run out)
    and is recorded in ``calls``; each ``escalate`` is counted in ``escalations`` and, while
    a run is in progress, plays ``on_escalate`` with that run's call (its updates go to the
    controller as the real kill's would; what it raises, ``escalate`` raises)."""

    def __init__(self, clock: ManualClock, *steps: Step,
                 activity: asyncio.Event | None = None) -> None:
        self.clock = clock
        self.activity = activity
        self.steps = list(steps)
        self.default: Step = reports(exited(100))
        self.calls: list[KillCall] = []
        self.escalations = 0
        self.on_escalate: Callable[[KillCall], None] | None = None
        self._running = 0

    def script(self, *steps: Step) -> None:
        self.steps = list(steps)

    def escalate(self) -> bool:
        if not self._running:
            return False
        self.escalations += 1
        _poke(self.activity)
        if self.on_escalate is not None:
            self.on_escalate(self.calls[-1])
        return True

    async def run(self, targets: Iterable[Target], policy: KillPolicy | None = None, *,
                  on_update: Callable[[ProcessOutcome], object] | None = None,
                  prior: PriorOutcomes | None = None,
                  hand_roots: Callable[[list[int]], str | None] | None = None
                  ) -> KillReport:
        assert policy is not None
        assert on_update is not None
        def update(outcome: ProcessOutcome) -> None:
            on_update(outcome)
            _poke(self.activity)

        recorded: dict[OutcomeKey, ProcessOutcome] | None = (
            None if prior is None else {(pid, at): o for (pid, at), o in prior.items()})
        call = KillCall(list(targets), policy, recorded, self.clock(), update)
        self.calls.append(call)
        _poke(self.activity)
        step = self.steps.pop(0) if self.steps else self.default
        self._running += 1
        try:
            return await step(call)
        finally:
            self._running -= 1


# --- processes ------------------------------------------------------------------------------


def exited(pid: int, *, depth: int = 0, exit_code: int | None = 0,
           fate: Fate = Fate.EXITED, signal: str | None = "SIGTERM") -> ProcessOutcome:
    """A process that ended after the graceful signal (exit 0 unless told otherwise)."""
    return ProcessOutcome(pid=pid, name="engine" if depth == 0 else "child",
                          start_time=float(pid), depth=depth, fate=fate, signal=signal,
                          exit_code=exit_code)


def key(process: ProcessOutcome) -> OutcomeKey:
    return (process.pid, process.start_time)


# --- the harness ----------------------------------------------------------------------------

CONFIG = DrainConfig(budget_s=30.0, tier_timeout_s=5.0, confirm_s=1.0,
                     termination_share=0.4, min_drain_s=0.0, prekill_timeout_s=2.0)
"""30 s: 18 s migration, 12 s termination; no minimum drain; 2 s for the pre-kill hooks."""


@dataclass
class Harness:
    """One controller with its fakes; ``outcomes`` and ``finished`` record the callbacks."""

    clock: ManualClock
    machine: PhaseMachine
    changes: FakeChanges
    fleet: FakeFleet
    kill: FakeKill
    controller: DrainController
    outcomes: list[ProcessOutcome]
    finished: list[DrainRecord]
    activity: asyncio.Event
    """Set by every fake after each call it records (see ``until``)."""

    @classmethod
    def build(cls, config: DrainConfig = CONFIG, fleet: FakeFleet | None = None, *,
              callbacks: bool = True) -> Harness:
        """``callbacks=False``: a controller built without ``on_outcome`` and ``on_finished``
        (the lists then stay empty)."""
        clock = ManualClock()
        machine = PhaseMachine(clock=clock)
        activity = asyncio.Event()
        changes = FakeChanges(clock, machine, activity)
        fleet = fleet if fleet is not None else FakeFleet()
        fleet.activity = activity
        kill = FakeKill(clock, activity=activity)
        outcomes: list[ProcessOutcome] = []
        finished: list[DrainRecord] = []
        controller = DrainController(machine=machine, changes=changes, fleet=fleet, kill=kill,
                                     config=config,
                                     on_outcome=outcomes.append if callbacks else None,
                                     on_finished=finished.append if callbacks else None,
                                     clock=clock)
        return cls(clock, machine, changes, fleet, kill, controller, outcomes, finished,
                   activity)

    async def until(self, condition: Callable[[], bool], what: str = "the condition") -> None:
        """Return once ``condition()`` holds, checked again after each call of a fake."""
        await wait_until(self.activity, condition, what)

    def phases(self) -> list[Phase]:
        return [t.phase for t in self.machine.timeline]

    def entered(self, phase: Phase) -> float:
        """When the machine last entered ``phase``."""
        return [t.at for t in self.machine.timeline if t.phase is phase][-1]

    async def finish(self) -> DrainRecord:
        """Run the drain to its end (it needs no real time: the fakes never sleep)."""
        assert await self.controller.wait(10.0), "the drain did not end"
        assert self.controller.last is not None
        return self.controller.last
