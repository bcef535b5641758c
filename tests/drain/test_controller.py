"""The drain controller, driven with fakes: a manual clock, a change signal that never sleeps,
a scripted fleet and a scripted kill (see ``tests/drain/fakes.py``). No real time passes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from coordinator.drain.controller import KILL_ATTEMPTS
from coordinator.drain.phases import IllegalTransition, Phase
from coordinator.drain.record import DrainConfig, DrainRecord
from coordinator.errors import DrainConflict, RefusedTarget
from coordinator.kill.policy import Target
from coordinator.kill.report import Fate, KillReport
from tests.drain.fakes import (
    CONFIG,
    T0,
    FakeFleet,
    Harness,
    KillCall,
    blocks,
    exited,
    key,
    raises,
    reports,
    settle,
    settles_after,
)

Make = Callable[..., Harness]

SLOW_START = DrainConfig(budget_s=30.0, tier_timeout_s=5.0, confirm_s=1.0, min_drain_s=5.0,
                         prekill_timeout_s=2.0)
"""``CONFIG`` with a 5 s minimum drain, so there is a wait in ``draining`` too."""

ROOT = exited(100)
CHILD = exited(101, depth=1)


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Builds harnesses; every controller built is closed (its task and timer end) after."""
    built: list[Harness] = []

    def build(config: DrainConfig = CONFIG, fleet: FakeFleet | None = None, *,
              callbacks: bool = True) -> Harness:
        harness = Harness.build(config, fleet, callbacks=callbacks)
        built.append(harness)
        return harness

    yield build
    for harness in built:
        await harness.controller.close()


async def held_in(h: Harness, phase: Phase) -> None:
    """Hold the drain's waits in ``phase`` and return once it is parked there."""
    h.changes.hold_in.add(phase)
    await h.until(lambda: h.controller.phase is phase and h.changes.held == 1,
                  f"a wait parked in {phase}")


def restart(before: Harness, make: Make, downtime_s: float,
            config: DrainConfig = CONFIG) -> tuple[Harness, DrainRecord, Phase]:
    """A second coordinator taking over what ``before`` persisted, ``downtime_s`` later."""
    assert before.controller.drain is not None
    record = before.controller.drain.to_record()
    phase, generation = before.machine.phase, before.machine.generation
    timeline = list(before.machine.timeline)
    after = make(config)
    after.clock.now = before.clock.now + downtime_s
    after.machine.restore(phase, generation, timeline)
    return after, DrainRecord.from_record(record), phase


# --- the whole drain ------------------------------------------------------------------------


async def test_a_drain_walks_every_phase_and_ends_graceful(make: Make) -> None:
    """1. start(): draining at once; the workers' push and a persist happen before anything
       awaits;
    2. nothing holds it: migrating, terminating (persist on disk, terminate pushed, pre-kill
       hooks settled) and the kill with a graceful policy;
    3. done: graceful, no causes, the kill's header kept without its processes, every
       persist in order, ``on_finished`` once."""
    h = make()
    h.kill.script(reports(ROOT, CHILD))
    drain, joined = h.controller.start("preStop")
    assert not joined
    running_at_once = h.controller.running
    assert h.controller.phase is Phase.DRAINING
    assert running_at_once
    assert h.fleet.calls == [("drain_started", drain), ("persist", False)]

    assert await h.finish() is drain
    assert h.phases() == list(Phase)
    assert drain.outcome == "graceful"
    assert drain.causes == []
    assert drain.errors == []
    assert drain.ended_at == T0
    assert drain.outcomes == {key(ROOT): ROOT, key(CHILD): CHILD}
    assert drain.kill is not None
    assert "processes" not in drain.kill
    assert drain.kill["mode"] == "graceful"
    assert [arg for name, arg in h.fleet.calls if name == "persist"] == [False, False, True,
                                                                          True]
    names = h.fleet.names()
    assert names.index("terminating") < names.index("kill_targets")
    assert names.index("kill_targets") < names.index("lost_requests")
    (call,) = h.kill.calls
    assert call.targets == h.fleet.targets
    assert call.prior is None
    assert call.policy.signal == CONFIG.kill_signal
    assert call.policy.tier_timeout_s == CONFIG.tier_timeout_s
    assert call.policy.confirm_s == CONFIG.confirm_s
    assert not call.policy.force
    assert h.finished == [drain]
    assert not h.controller.running
    assert h.controller.drain is drain


# --- abort, phase by phase ------------------------------------------------------------------


async def test_abort_in_draining_returns_to_serving(make: Make) -> None:
    """1. a drain with a minimum drain is parked in draining;
    2. abort(): serving again, outcome ``aborted``, ``drain_aborted`` pushed, the drain kept
       as ``last`` and reported finished;
    3. its task ends without ever killing anything."""
    h = make(SLOW_START)
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.DRAINING)
    h.clock.advance(1.0)

    assert h.controller.abort() is drain
    assert h.controller.phase is Phase.SERVING
    assert h.machine.timeline[-1].note == "aborted"
    assert drain.outcome == "aborted"
    assert drain.ended_at == T0 + 1.0
    assert h.fleet.names()[-1] == "drain_aborted"
    assert h.controller.drain is None
    assert h.controller.last is drain
    assert h.finished == [drain]
    assert await h.controller.wait(0)
    await settle()
    assert h.kill.calls == []
    assert h.changes.held == 0


async def test_abort_in_migrating_returns_to_serving(make: Make) -> None:
    """1. a drain is parked in migrating (the workers still have requests in flight);
    2. abort(): serving, outcome ``aborted``, ``drain_aborted`` pushed;
    3. no kill ever runs, and a new start() begins a fresh drain."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)

    assert h.controller.abort() is drain
    assert h.controller.phase is Phase.SERVING
    assert drain.outcome == "aborted"
    assert h.fleet.count("drain_aborted") == 1
    assert h.finished == [drain]
    await settle()
    assert h.kill.calls == []
    again, joined = h.controller.start("preStop")
    assert not joined
    assert again is not drain


async def test_abort_in_terminating_raises_drain_conflict(make: Make) -> None:
    """1. a drain is parked in terminating, waiting for the workers' pre-kill hooks;
    2. abort() raises ``DrainConflict`` and changes nothing;
    3. the hooks' wait ends and the drain finishes ``done`` as if nothing was asked."""
    h = make(fleet=FakeFleet(prekill=lambda ids: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.TERMINATING)

    with pytest.raises(DrainConflict, match="can no longer be aborted"):
        h.controller.abort()
    assert h.controller.phase is Phase.TERMINATING
    assert h.fleet.count("drain_aborted") == 0
    h.changes.release()
    assert await h.finish() is drain
    assert drain.outcome == "graceful"


async def test_abort_during_the_kill_raises_drain_conflict(make: Make) -> None:
    """1. the kill runs (blocked on an event);
    2. abort() raises ``DrainConflict``;
    3. the kill is released and the drain ends ``done`` with its report."""
    h = make()
    release = asyncio.Event()
    h.kill.script(blocks(release, reports(ROOT)))
    drain, _ = h.controller.start("preStop")
    await h.until(lambda: len(h.kill.calls) == 1, "the kill started")

    with pytest.raises(DrainConflict):
        h.controller.abort()
    release.set()
    assert await h.finish() is drain
    assert drain.outcome == "graceful"
    assert h.fleet.count("drain_aborted") == 0


async def test_abort_when_done_raises_drain_conflict(make: Make) -> None:
    """1. a drain runs to ``done``;
    2. abort() raises ``DrainConflict`` naming the done drain;
    3. the drain and its outcome stay as they were."""
    h = make()
    drain, _ = h.controller.start("preStop")
    await h.finish()

    with pytest.raises(DrainConflict, match="the drain is done"):
        h.controller.abort()
    assert h.controller.phase is Phase.DONE
    assert h.controller.drain is drain
    assert drain.outcome == "graceful"


async def test_abort_while_serving_raises(make: Make) -> None:
    """1. no drain ever started: abort() raises ``DrainConflict``;
    2. a drain that was aborted: a second abort() raises too (serving again)."""
    h = make(SLOW_START)
    with pytest.raises(DrainConflict, match="no drain is running"):
        h.controller.abort()
    h.controller.start("preStop")
    h.controller.abort()
    with pytest.raises(DrainConflict, match="no drain is running"):
        h.controller.abort()
    assert h.fleet.count("drain_aborted") == 1


async def test_an_abort_racing_the_move_to_terminating_stops_the_task(make: Make) -> None:
    """1. the migration check itself aborts the drain (an abort landing between the check and
       the move to terminating);
    2. the move is refused, the task stops quietly;
    3. serving, outcome ``aborted``, nothing killed."""
    h = make()
    h.fleet.hooks["migration_settled"] = h.controller.abort
    drain, _ = h.controller.start("preStop")
    await h.until(lambda: h.fleet.count("drain_aborted") == 1, "the abort")
    await settle()

    assert h.controller.phase is Phase.SERVING
    assert drain.outcome == "aborted"
    assert drain.errors == []
    assert h.kill.calls == []
    assert h.finished == [drain]


async def test_an_abort_from_the_persist_of_migrating_stops_the_task(make: Make) -> None:
    """1. the persist made on entering migrating aborts the drain (an abort landing between
       two steps of the task);
    2. the task finds the drain no longer running and stops before any wait;
    3. serving, outcome ``aborted``, nothing killed."""
    h = make(fleet=FakeFleet(settled=lambda: False))

    def abort_once_migrating() -> None:
        if h.controller.phase is Phase.MIGRATING:
            h.controller.abort()

    h.fleet.hooks["persist"] = abort_once_migrating
    drain, _ = h.controller.start("preStop")
    await h.until(lambda: h.fleet.count("drain_aborted") == 1, "the abort")
    await settle()

    assert h.controller.phase is Phase.SERVING
    assert drain.outcome == "aborted"
    assert h.changes.waits == []
    assert h.fleet.count("migration_settled") == 0
    assert h.kill.calls == []


# --- joining --------------------------------------------------------------------------------


async def test_a_second_start_joins_the_running_drain(make: Make) -> None:
    """1. a drain is parked in migrating;
    2. a second start(), with another reason and a shorter deadline, returns the same drain
       with joined=True and changes nothing (no second push, same budget, no escalation);
    3. the drain ends with one kill."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)
    generation = h.machine.generation

    again, joined = h.controller.start("operator", deadline_s=1.0)
    assert again is drain
    assert joined
    assert drain.reason == "preStop"
    assert drain.split.total_s == CONFIG.budget_s
    assert not drain.force
    assert h.fleet.count("drain_started") == 1
    assert h.machine.generation == generation
    h.changes.release()
    await h.finish()
    assert len(h.kill.calls) == 1


async def test_a_start_after_done_joins_the_done_drain_and_force_changes_nothing(
        make: Make) -> None:
    """1. a drain runs to ``done``;
    2. start(force=True) returns it with joined=True;
    3. it is not escalated: no force flag, no second kill, still done."""
    h = make()
    drain, _ = h.controller.start("preStop")
    await h.finish()

    again, joined = h.controller.start("operator", force=True)
    await settle()
    assert (again, joined) == (drain, True)
    assert not drain.force
    assert len(h.kill.calls) == 1
    assert h.controller.phase is Phase.DONE


async def test_a_force_join_of_a_force_drain_does_not_escalate_again(make: Make) -> None:
    """1. a force drain's kill runs (blocked);
    2. another start(force=True) joins it: no escalation call to the kill;
    3. the drain ends with the one kill."""
    h = make()
    release = asyncio.Event()
    h.kill.script(blocks(release, reports(exited(100, fate=Fate.KILLED, exit_code=-9))))
    drain, _ = h.controller.start("operator", force=True)
    await h.until(lambda: len(h.kill.calls) == 1, "the kill started")

    assert h.controller.start("operator", force=True) == (drain, True)
    release.set()
    await h.finish()
    await settle()
    assert len(h.kill.calls) == 1


# --- force ----------------------------------------------------------------------------------


async def test_a_force_start_skips_every_wait(make: Make) -> None:
    """1. start(force=True) with a minimum drain, workers that never settle and pre-kill hooks
       that never report;
    2. no wait at all: every phase is entered at the same instant;
    3. the kill gets a force policy; SIGKILLed processes give ``killed``, not ``signalled``."""
    h = make(SLOW_START, FakeFleet(settled=lambda: False, prekill=lambda ids: False))
    h.kill.script(reports(exited(100, fate=Fate.KILLED, exit_code=-9, signal=None),
                          exited(101, depth=1, exit_code=-9, signal=None)))
    drain, _ = h.controller.start("operator", force=True)
    assert drain.force

    await h.finish()
    assert h.changes.waits == []
    assert {t.at for t in h.machine.timeline[1:]} == {T0}
    (call,) = h.kill.calls
    assert call.policy.force
    assert drain.outcome == "killed"
    assert drain.to_status()["force"] is True


async def test_a_force_join_in_draining_ends_the_minimum_drain(make: Make) -> None:
    """1. a graceful drain is parked in its minimum drain;
    2. start(force=True) joins it and escalates it: force flag, generation bumped, persisted,
       the wait woken;
    3. no further wait (migration, pre-kill); the kill gets a force policy."""
    h = make(SLOW_START, FakeFleet(settled=lambda: False, prekill=lambda ids: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.DRAINING)
    generation, persists = h.machine.generation, h.fleet.persist_count

    assert h.controller.start("operator", force=True) == (drain, True)
    assert drain.force
    assert h.machine.generation == generation + 1
    assert h.fleet.persist_count == persists + 1
    await h.finish()
    assert h.changes.waits == [(Phase.DRAINING, SLOW_START.min_drain_s)]
    assert h.entered(Phase.TERMINATING) == T0
    (call,) = h.kill.calls
    assert call.policy.force


async def test_a_force_join_in_migrating_ends_the_migration(make: Make) -> None:
    """1. a graceful drain is parked in migrating (workers never settle);
    2. start(force=True) joins and wakes it;
    3. the pre-kill wait is skipped and the kill gets a force policy."""
    h = make(fleet=FakeFleet(settled=lambda: False, prekill=lambda ids: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)

    assert h.controller.start("operator", force=True) == (drain, True)
    await h.finish()
    assert [phase for phase, _ in h.changes.waits] == [Phase.MIGRATING]
    (call,) = h.kill.calls
    assert call.policy.force


async def test_a_force_join_in_the_prekill_wait_ends_it(make: Make) -> None:
    """1. a graceful drain is parked waiting for the pre-kill hooks;
    2. start(force=True) joins and wakes it;
    3. the kill (not yet running, so called once) gets a force policy."""
    h = make(fleet=FakeFleet(prekill=lambda ids: False))
    drain, _ = h.controller.start("preStop")
    await held_in(h, Phase.TERMINATING)

    assert h.controller.start("operator", force=True) == (drain, True)
    await h.finish()
    (call,) = h.kill.calls
    assert call.policy.force
    assert drain.force


async def test_a_force_join_during_the_kill_escalates_it(make: Make) -> None:
    """1. the graceful kill runs (blocked on an event);
    2. start(force=True) joins: the running kill is escalated at once (no second kill, no
       task left behind);
    3. what the escalated kill reports is recorded; the kill is released and the drain ends
       ``killed``, as a force drain."""
    h = make()
    release = asyncio.Event()
    killed = exited(100, fate=Fate.KILLED, exit_code=-9)
    h.kill.script(blocks(release, reports(killed)))
    h.kill.on_escalate = lambda call: call.on_update(killed)
    drain, _ = h.controller.start("preStop")
    await h.until(lambda: len(h.kill.calls) == 1, "the kill started")
    assert not h.kill.calls[0].policy.force

    assert h.controller.start("operator", force=True) == (drain, True)
    assert h.kill.escalations == 1
    assert len(h.kill.calls) == 1
    assert drain.outcomes == {key(killed): killed}
    assert h.outcomes == [killed]
    release.set()
    await h.finish()
    assert drain.force
    assert drain.outcome == "killed"
    assert "force drain" in drain.causes[0]


# --- time: minimum drain, migration, pre-kill, budget ---------------------------------------


async def test_the_minimum_drain_is_honoured(make: Make) -> None:
    """1. workers are settled from the start, but the drain must stay 5 s in draining;
    2. changes arrive every 2 s: each one re-checks and waits for what is left (5, 3, 1);
    3. migrating is entered exactly at the end of the minimum drain, and left at once."""
    h = make(SLOW_START)
    h.changes.step_s = 2.0
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.changes.waits == [(Phase.DRAINING, 5.0), (Phase.DRAINING, 3.0),
                               (Phase.DRAINING, 1.0)]
    assert h.entered(Phase.MIGRATING) == drain.deadlines.min_drain_until == T0 + 5.0
    assert h.entered(Phase.TERMINATING) == T0 + 5.0


async def test_migration_ends_early_and_the_kill_gets_the_unused_seconds(make: Make) -> None:
    """1. the workers report every second; they are settled after 3 checks;
    2. migrating ends 3 s after the start, 15 s before its deadline;
    3. the kill's deadline is everything left of the budget: the termination share plus the
       15 s the migration did not use."""
    h = make(fleet=FakeFleet(settled=settles_after(3)))
    h.changes.step_s = 1.0
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert [timeout for _, timeout in h.changes.waits] == [18.0, 17.0, 16.0]
    assert h.entered(Phase.TERMINATING) == T0 + 3.0
    (call,) = h.kill.calls
    assert call.at == T0 + 3.0
    assert call.policy.deadline_s == drain.deadlines.deadline_at - call.at
    unused = drain.deadlines.migration_deadline_at - call.at
    assert unused == 15.0
    assert call.policy.deadline_s == drain.split.termination_s + unused == 27.0


async def test_migration_that_never_settles_ends_at_its_deadline(make: Make) -> None:
    """1. the workers never settle;
    2. migrating lasts until its deadline (18 s of the 30 s budget);
    3. the kill gets exactly the termination share."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.changes.waits == [(Phase.MIGRATING, 18.0)]
    assert h.entered(Phase.TERMINATING) == drain.deadlines.migration_deadline_at
    (call,) = h.kill.calls
    assert call.policy.deadline_s == drain.split.termination_s == 12.0


async def test_the_prekill_wait_is_bounded(make: Make) -> None:
    """1. terminate is pushed; one worker's pre-kill hook never reports;
    2. the controller waits for exactly that worker, at most ``prekill_timeout_s``;
    3. then the kill runs, with that much less time."""
    h = make(fleet=FakeFleet(prekill=lambda ids: False, prekill_ids=["w1"]))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.changes.waits == [(Phase.TERMINATING, CONFIG.prekill_timeout_s)]
    assert ("prekill_settled", ["w1"]) in h.fleet.calls
    (call,) = h.kill.calls
    assert call.at == T0 + CONFIG.prekill_timeout_s
    assert call.policy.deadline_s == drain.deadlines.deadline_at - call.at == 28.0


async def test_the_prekill_wait_stops_at_the_budget_and_the_kill_keeps_a_floor(
        make: Make) -> None:
    """1. a pre-kill timeout longer than what is left of the budget, workers that never
       settle and hooks that never report;
    2. the pre-kill wait ends at the budget's end, not at its own timeout;
    3. the kill still gets a deadline: the 0.1 s floor."""
    config = DrainConfig(budget_s=30.0, tier_timeout_s=5.0, confirm_s=1.0,
                         prekill_timeout_s=60.0)
    h = make(config, FakeFleet(settled=lambda: False, prekill=lambda ids: False))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.changes.waits == [(Phase.MIGRATING, 18.0), (Phase.TERMINATING, 12.0)]
    (call,) = h.kill.calls
    assert call.at == drain.deadlines.deadline_at
    assert call.policy.deadline_s == 0.1


async def test_the_budget_timer_follows_the_clock_and_is_replaced_by_the_next_drain(
        make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. start(): ``budget_ended`` is scheduled the whole budget ahead (by the clock);
    2. abort, 10 s later start again: the first timer is cancelled, the new one is a whole
       budget ahead again;
    3. the drain ends and ``new_cycle()`` cancels its timer too."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    loop = asyncio.get_running_loop()
    timers: list[tuple[float, asyncio.TimerHandle]] = []
    call_later = loop.call_later

    def spy(delay: float, callback: Callable[..., object], *args: Any,
            context: Any = None) -> asyncio.TimerHandle:
        handle = call_later(delay, callback, *args, context=context)
        if callback == h.fleet.budget_ended:
            timers.append((delay, handle))
        return handle

    monkeypatch.setattr(loop, "call_later", spy)
    h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)
    h.controller.abort()
    h.clock.advance(10.0)
    h.changes.release()
    h.controller.start("preStop")
    await h.finish()

    assert [delay for delay, _ in timers] == [CONFIG.budget_s, CONFIG.budget_s]
    assert timers[0][1].cancelled()
    assert not timers[1][1].cancelled()
    h.controller.new_cycle("worker registered")
    assert timers[1][1].cancelled()
    assert h.fleet.count("budget_ended") == 0


# --- resume after a restart -----------------------------------------------------------------


async def test_resume_in_draining_keeps_the_minimum_drain(make: Make) -> None:
    """1. a coordinator is killed 1 s into a 5 s minimum drain; a new one starts 1 s later;
    2. resume(): the workers are told again and the drain waits only the 3 s left;
    3. the drain goes on to ``done`` on its original deadlines."""
    before = make(SLOW_START)
    before.controller.start("preStop")
    await held_in(before, Phase.DRAINING)
    before.clock.advance(1.0)
    h, drain, phase = restart(before, make, 1.0, SLOW_START)

    h.controller.resume(drain, phase)
    assert h.fleet.calls == [("drain_started", drain)]
    await h.finish()
    assert h.changes.waits[0] == (Phase.DRAINING, 3.0)
    assert h.entered(Phase.MIGRATING) == T0 + 5.0
    assert drain.outcome == "graceful"
    assert len(h.kill.calls) == 1


async def test_resume_in_migrating_keeps_the_migration_deadline(make: Make) -> None:
    """1. a coordinator is killed while migrating, 4 s after the start; the new one starts
       6 s after that;
    2. resume(): the migration waits only until its original deadline (8 s left);
    3. the kill gets what is left of the budget."""
    before = make(fleet=FakeFleet(settled=lambda: False))
    before.controller.start("preStop")
    await held_in(before, Phase.MIGRATING)
    before.clock.advance(4.0)
    h, drain, phase = restart(before, make, 6.0)
    h.fleet.settled = lambda: False

    h.controller.resume(drain, phase)
    await h.finish()
    assert h.changes.waits == [(Phase.MIGRATING, 8.0)]
    (call,) = h.kill.calls
    assert call.at == drain.deadlines.migration_deadline_at
    assert call.policy.deadline_s == 12.0
    assert drain.outcome == "graceful"


async def test_resume_in_terminating_passes_what_was_killed_as_prior(make: Make) -> None:
    """1. a coordinator is killed during the kill, after the child was reported exited;
    2. resume(): the kill runs again with that outcome as ``prior`` (no process signalled
       twice), and no wait of draining or migrating;
    3. done: both processes judged."""
    before = make()
    before.kill.script(_updates_then_blocks(asyncio.Event()))
    first, _ = before.controller.start("preStop")
    await before.until(lambda: key(CHILD) in first.outcomes, "the child reported")
    h, drain, phase = restart(before, make, 1.0)
    assert phase is Phase.TERMINATING
    h.kill.script(reports(ROOT, CHILD))

    h.controller.resume(drain, phase)
    await h.finish()
    (call,) = h.kill.calls
    assert call.prior == {key(CHILD): CHILD}
    assert all(p is not Phase.DRAINING and p is not Phase.MIGRATING for p, _ in h.changes.waits)
    assert set(drain.outcomes) == {key(ROOT), key(CHILD)}
    assert drain.outcome == "graceful"


def _updates_then_blocks(never: asyncio.Event) -> Callable[[KillCall], Any]:
    """A kill that reports the child exited, then never ends."""

    async def step(call: KillCall) -> KillReport:
        call.on_update(CHILD)
        await never.wait()
        raise AssertionError("released")

    return step


async def test_resume_of_a_done_drain_starts_nothing(make: Make) -> None:
    """1. a drain ran to ``done``; a new coordinator takes it over;
    2. resume(): no task (no push, no kill), the drain is ``last`` and ``wait`` answers at
       once;
    3. ``new_cycle()`` goes back to serving."""
    before = make()
    before.controller.start("preStop")
    await before.finish()
    h, drain, phase = restart(before, make, 1.0)
    assert phase is Phase.DONE

    h.controller.resume(drain, phase)
    await settle()
    assert h.fleet.calls == []
    assert h.kill.calls == []
    assert h.controller.last is drain
    assert h.controller.drain is drain
    assert await h.controller.wait(0)
    assert h.finished == []
    assert h.controller.new_cycle("worker registered") is drain
    assert h.controller.phase is Phase.SERVING


async def test_resume_past_the_budget_ends_the_budget_at_once(make: Make) -> None:
    """1. a coordinator is killed while migrating; the new one starts after the whole budget
       is over;
    2. resume(): ``budget_ended`` is due at once; no wait (every deadline has passed);
    3. the kill still runs, with the 0.1 s floor."""
    before = make(fleet=FakeFleet(settled=lambda: False))
    before.controller.start("preStop")
    await held_in(before, Phase.MIGRATING)
    h, drain, phase = restart(before, make, 60.0)

    h.controller.resume(drain, phase)
    await h.finish()
    await h.until(lambda: h.fleet.count("budget_ended") == 1, "the budget's end")
    assert h.changes.waits == []
    (call,) = h.kill.calls
    assert call.policy.deadline_s == 0.1


# --- a new cycle ----------------------------------------------------------------------------


async def test_new_cycle_from_done_returns_to_serving_and_keeps_the_drain(make: Make) -> None:
    """1. a drain runs to ``done``;
    2. new_cycle(): serving, the drain returned and kept as ``last``, none current;
    3. the next start() is a fresh drain, not a join."""
    h = make()
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.controller.new_cycle("worker registered") is drain
    assert h.controller.phase is Phase.SERVING
    assert h.machine.timeline[-1].note == "worker registered"
    assert h.controller.drain is None
    assert h.controller.last is drain
    fresh, joined = h.controller.start("preStop")
    assert not joined
    assert fresh is not drain


@pytest.mark.parametrize("phase", [Phase.SERVING, Phase.DRAINING, Phase.MIGRATING,
                                   Phase.TERMINATING])
async def test_new_cycle_is_refused_outside_done(make: Make, phase: Phase) -> None:
    """1. bring the controller to ``phase`` (parked there);
    2. new_cycle() raises ``IllegalTransition``;
    3. the phase and the drain stay."""
    h = make(SLOW_START, FakeFleet(settled=lambda: False, prekill=lambda ids: False))
    if phase is not Phase.SERVING:
        h.controller.start("preStop")
        await held_in(h, phase)
    drain = h.controller.drain

    with pytest.raises(IllegalTransition):
        h.controller.new_cycle("worker registered")
    assert h.controller.phase is phase
    assert h.controller.drain is drain


async def test_new_cycle_of_a_restored_done_without_a_drain_returns_none(
        make: Make) -> None:
    """1. a restarted coordinator restores ``done`` but has no drain record to resume;
    2. new_cycle(): serving, returns None, ``last`` stays unset."""
    h = make()
    h.machine.restore(Phase.DONE, 5, list(h.machine.timeline))

    assert h.controller.new_cycle("worker registered") is None
    assert h.controller.phase is Phase.SERVING
    assert h.controller.last is None
    assert h.machine.timeline[-1].phase is Phase.SERVING


# --- a kill that fails ----------------------------------------------------------------------


async def test_a_kill_that_raises_once_runs_again_from_what_it_did(make: Make) -> None:
    """1. the first kill reports the child exited, then raises;
    2. it is run again with the same targets and the child as ``prior``;
    3. done, with both processes and the failure in ``errors`` (so not graceful)."""
    h = make()
    h.kill.script(raises(RuntimeError("pidfd table full"), updates=[CHILD]),
                  reports(ROOT, CHILD))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    first, second = h.kill.calls
    assert first.prior is None
    assert second.prior == {key(CHILD): CHILD}
    assert second.targets == first.targets == h.fleet.targets
    assert h.controller.phase is Phase.DONE
    assert drain.errors == ["the kill (attempt 1) failed (RuntimeError: pidfd table full)"]
    assert set(drain.outcomes) == {key(ROOT), key(CHILD)}
    assert drain.kill is not None
    assert drain.outcome == "error"


async def test_a_kill_that_raises_twice_ends_done_not_graceful(make: Make) -> None:
    """1. every kill raises (the second one after reporting the root exited);
    2. it is tried ``KILL_ATTEMPTS`` times, no more;
    3. done without a kill report, what was reported kept, both failures recorded."""
    h = make()
    h.kill.script(raises(RuntimeError("first")), raises(RuntimeError("second"), updates=[ROOT]),
                  reports(ROOT))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert len(h.kill.calls) == KILL_ATTEMPTS == 2
    assert h.kill.calls[1].prior is None
    assert h.controller.phase is Phase.DONE
    assert drain.kill is None
    assert drain.outcomes == {key(ROOT): ROOT}
    assert drain.errors == ["the kill (attempt 1) failed (RuntimeError: first)",
                            "the kill (attempt 2) failed (RuntimeError: second)"]
    assert drain.outcome == "error"
    assert any("second" in cause for cause in drain.causes)


async def test_a_refused_target_is_dropped_and_the_others_still_killed(make: Make) -> None:
    """1. two roots; the kill refuses the first (it became protected since registration);
    2. the kill runs again with the other one only;
    3. done: the refusal is in ``errors``, the other root's outcome judged."""
    other = exited(200)
    fleet = FakeFleet(targets=[Target(100, start_time=1.0), Target(200, start_time=2.0)])
    h = make(fleet=fleet)
    h.kill.script(raises(RefusedTarget(100, "it is an ancestor of the calling process")),
                  reports(other))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    first, second = h.kill.calls
    assert [t.pid for t in first.targets] == [100, 200]
    assert [t.pid for t in second.targets] == [200]
    assert drain.errors == ["kill refused pid 100: refusing to signal pid 100: it is an "
                            "ancestor of the calling process"]
    assert drain.outcomes == {key(other): other}
    assert drain.outcome == "error"


# --- failing bookkeeping: the kill runs anyway ----------------------------------------------


async def test_a_failing_persist_at_start_is_recorded_and_the_drain_goes_on(
        make: Make) -> None:
    """1. the first persist (inside start()) raises;
    2. start() still returns the drain (it did start: readiness failed, workers told);
    3. the kill runs, done, the failure in ``errors``."""
    h = make(fleet=FakeFleet(persist_failures={1: "raise"}))
    drain, _ = h.controller.start("preStop")  # raises the OSError today
    await h.finish()
    assert len(h.kill.calls) == 1
    assert h.controller.phase is Phase.DONE
    assert drain.errors != []


async def test_a_failing_persist_entering_migrating_still_kills(make: Make) -> None:
    """1. the persist after entering migrating raises;
    2. the drain goes straight on to terminating (the failure is "before the kill");
    3. the kill runs; done with the failure in ``errors``."""
    h = make(fleet=FakeFleet(persist_failures={2: "raise"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert len(h.kill.calls) == 1
    assert h.controller.phase is Phase.DONE
    assert drain.errors == ["persisting the state failed (OSError: state file write 2 failed)"]
    assert drain.outcome == "error"


@pytest.mark.parametrize("how", ["raise", "await"])
async def test_a_failing_persist_before_the_kill_still_kills(make: Make, how: str) -> None:
    """1. the persist on entering terminating (``now=True``) raises, or its flush does;
    2. terminate is still pushed and the kill still runs;
    3. done, the failure in ``errors``."""
    h = make(fleet=FakeFleet(persist_failures={3: "raise" if how == "raise" else "await"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.fleet.count("terminating") == 1
    assert len(h.kill.calls) == 1
    assert h.controller.phase is Phase.DONE
    assert len(drain.errors) == 1
    assert drain.errors[0].startswith("persisting the state failed (OSError: state file")
    assert drain.outcome == "error"


@pytest.mark.parametrize("how", ["raise", "await"])
async def test_a_failing_persist_at_done_turns_graceful_into_error(make: Make,
                                                                   how: str) -> None:
    """1. the last persist (``now=True``, after the verdict) raises, or its flush does;
    2. the drain is done and finished all the same;
    3. a graceful verdict becomes ``error``, the failure in ``errors`` and ``causes``."""
    h = make(fleet=FakeFleet(persist_failures={4: "raise" if how == "raise" else "await"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.controller.phase is Phase.DONE
    assert h.finished == [drain]
    assert len(drain.errors) == 1
    assert drain.outcome == "error"
    assert len(drain.causes) == 1
    assert "persisting the state failed" in drain.causes[0]


async def test_a_failing_persist_at_done_is_a_cause_of_a_non_graceful_drain(
        make: Make) -> None:
    """1. the kill needed SIGKILL (verdict ``killed``); the last persist fails;
    2. the outcome stays ``killed`` (the more severe);
    3. the failure is among the causes, as every internal failure before the verdict is."""
    h = make(fleet=FakeFleet(persist_failures={4: "raise"}))
    h.kill.script(reports(exited(100, fate=Fate.KILLED, exit_code=-9)))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert drain.outcome == "killed"
    assert len(drain.errors) == 1
    assert any("persisting the state" in cause for cause in drain.causes)


async def test_a_failing_persist_on_escalation_still_escalates(make: Make) -> None:
    """1. the graceful kill runs (blocked); the persist of the escalation will raise;
    2. start(force=True) joins the drain;
    3. the running kill is still escalated and the failure is in ``errors``."""
    h = make()
    release = asyncio.Event()
    h.kill.script(blocks(release, reports(ROOT)))
    drain, _ = h.controller.start("preStop")
    await h.until(lambda: len(h.kill.calls) == 1, "the kill started")
    h.fleet.persist_failures[h.fleet.persist_count + 1] = "raise"

    try:
        h.controller.start("operator", force=True)
        assert h.kill.escalations == 1
        assert len(h.kill.calls) == 1
    finally:
        release.set()
        await h.finish()
    assert drain.errors != []


async def test_a_failing_terminate_push_still_kills(make: Make) -> None:
    """1. ``fleet.terminating()`` raises;
    2. nothing to wait for: the pre-kill check is for no worker;
    3. the kill runs; done with the failure in ``errors``."""
    h = make(fleet=FakeFleet(failing={"terminating"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert ("prekill_settled", []) in h.fleet.calls
    assert len(h.kill.calls) == 1
    assert drain.errors == ["pushing terminate to the workers failed (RuntimeError: "
                            "terminating broke)"]
    assert drain.outcome == "error"


async def test_failing_kill_targets_still_run_the_kill(make: Make) -> None:
    """1. ``fleet.kill_targets()`` raises;
    2. the kill runs with no target (it still finds nothing to do, and says so);
    3. done with the failure in ``errors``; ``error`` outranks ``nothing_to_drain``."""
    h = make(fleet=FakeFleet(failing={"kill_targets"}))
    h.kill.script(reports())
    drain, _ = h.controller.start("preStop")
    await h.finish()

    (call,) = h.kill.calls
    assert call.targets == []
    assert drain.errors == ["listing the processes to kill failed (RuntimeError: "
                            "kill_targets broke)"]
    assert drain.outcome == "error"
    assert len(drain.causes) == 2


async def test_a_failing_migration_check_goes_on_to_the_kill(make: Make) -> None:
    """1. ``fleet.migration_settled()`` raises in migrating;
    2. the drain moves on to terminating at once;
    3. the kill runs; done with the failure in ``errors``."""
    h = make(fleet=FakeFleet(failing={"migration_settled"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.phases() == list(Phase)
    assert len(h.kill.calls) == 1
    assert drain.errors == ["before the kill failed (RuntimeError: migration_settled broke)"]


async def test_a_failing_wait_in_draining_goes_on_to_the_kill(make: Make) -> None:
    """1. the minimum drain's wait raises (in draining);
    2. the drain passes through migrating to terminating, each step in the timeline;
    3. the kill runs; done with the failure in ``errors``."""
    h = make(SLOW_START)
    h.changes.fail = RuntimeError("loop broke")
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.phases() == list(Phase)
    assert len(h.kill.calls) == 1
    assert drain.errors == ["before the kill failed (RuntimeError: loop broke)"]


async def test_a_failing_prekill_check_still_kills(make: Make) -> None:
    """1. ``fleet.prekill_settled()`` raises;
    2. the pre-kill wait is given up;
    3. the kill runs; done with the failure in ``errors``."""
    h = make(fleet=FakeFleet(failing={"prekill_settled"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert len(h.kill.calls) == 1
    assert drain.errors == ["waiting for the pre-kill hooks failed (RuntimeError: "
                            "prekill_settled broke)"]


async def test_a_failing_lost_requests_count_is_recorded(make: Make) -> None:
    """1. ``fleet.lost_requests()`` raises after the kill;
    2. the drain is judged with no lost request known;
    3. done, ``error``, the failure in ``errors``."""
    h = make(fleet=FakeFleet(failing={"lost_requests"}))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert drain.lost_requests == 0
    assert drain.errors == ["counting lost requests failed (RuntimeError: lost_requests "
                            "broke)"]
    assert drain.outcome == "error"


# --- the verdict ----------------------------------------------------------------------------


async def test_lost_requests_make_the_outcome_lost_requests(make: Make) -> None:
    """1. every process ends cleanly, but the fleet counts 2 handoffs no router acknowledged;
    2. done: outcome ``lost_requests``, the count kept on the drain."""
    h = make(fleet=FakeFleet(lost=2))
    h.kill.script(reports(ROOT, CHILD))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert ("lost_requests", drain) in h.fleet.calls
    assert drain.lost_requests == 2
    assert drain.outcome == "lost_requests"
    assert drain.to_status()["lost_requests"] == 2


async def test_a_kill_that_reports_nothing_gives_nothing_to_drain(make: Make) -> None:
    """1. no target, and the kill reports no process;
    2. done: outcome ``nothing_to_drain``."""
    h = make(fleet=FakeFleet(targets=[]))
    h.kill.script(reports())
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.kill.calls[0].targets == []
    assert drain.outcomes == {}
    assert drain.outcome == "nothing_to_drain"


async def test_a_root_that_died_of_sigkill_is_not_graceful(make: Make) -> None:
    """1. the kill reports the root ``exited`` with code -9 (died of SIGKILL, not of the
       SIGTERM it was sent);
    2. done: not graceful (``signalled``), its container's 137 named."""
    h = make()
    h.kill.script(reports(exited(100, exit_code=-9), CHILD))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert drain.outcome == "signalled"
    assert drain.outcome != "graceful"
    assert any("137" in cause for cause in drain.causes)


async def test_on_outcome_sees_every_update_and_on_finished_the_end(make: Make) -> None:
    """1. the kill reports the child, then the root, through ``on_update`` as they end;
    2. ``on_outcome`` gets each one as it comes, and the drain records them;
    3. ``on_finished`` is called once, with the done drain."""
    h = make()
    seen_in_drain: list[int] = []

    async def step(call: KillCall) -> KillReport:
        for process in (CHILD, ROOT):
            call.on_update(process)
            drain = h.controller.drain
            assert drain is not None
            seen_in_drain.append(len(drain.outcomes))
        assert h.finished == []
        return KillReport(started_at=call.at, processes=[CHILD, ROOT])

    h.kill.script(step)
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert h.outcomes == [CHILD, ROOT]
    assert seen_in_drain == [1, 2]
    assert h.finished == [drain]
    assert drain.outcome == "graceful"


async def test_a_late_update_after_the_cycle_ended_only_reaches_on_outcome(
        make: Make) -> None:
    """1. a drain ends and a new cycle starts (no current drain);
    2. an update arrives late from the finished kill;
    3. ``on_outcome`` hears it; the finished drain's record is not changed."""
    h = make()
    h.kill.script(reports(ROOT))
    drain, _ = h.controller.start("preStop")
    await h.finish()
    h.controller.new_cycle("worker registered")
    late = exited(300)

    h.kill.calls[0].on_update(late)
    assert h.outcomes == [late]
    assert key(late) not in drain.outcomes


async def test_a_drain_needs_no_callbacks_and_no_flush_to_await(make: Make) -> None:
    """1. a controller built without ``on_outcome`` and ``on_finished``, and a fleet whose
       ``persist(now=True)`` saved synchronously (returns nothing to await);
    2. the kill reports through ``on_update``;
    3. the drain still records the update and ends ``done``, graceful."""
    h = make(fleet=FakeFleet(flushes=False), callbacks=False)
    h.kill.script(reports(ROOT, updates=[ROOT]))
    drain, _ = h.controller.start("preStop")
    await h.finish()

    assert [arg for name, arg in h.fleet.calls if name == "persist"] == [False, False, True,
                                                                          True]
    assert drain.outcomes == {key(ROOT): ROOT}
    assert drain.outcome == "graceful"
    assert h.outcomes == []
    assert h.finished == []


# --- wait and close -------------------------------------------------------------------------


async def test_wait_times_out_while_the_drain_runs(make: Make) -> None:
    """1. a drain is parked in migrating;
    2. wait(0) answers False (still running);
    3. released, the drain ends: wait answers True, and again at once."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)

    assert not await h.controller.wait(0)
    h.changes.release()
    assert await h.controller.wait(10.0)
    assert await h.controller.wait(0)


async def test_close_cancels_the_running_drain(make: Make) -> None:
    """1. close() of a controller that never drained does nothing;
    2. a drain is parked in migrating; close() cancels its task and its budget timer;
    3. nothing is killed, the phase stays; a second close() is harmless."""
    h = make(fleet=FakeFleet(settled=lambda: False))
    await h.controller.close()
    h.controller.start("preStop")
    await held_in(h, Phase.MIGRATING)

    await h.controller.close()
    assert h.changes.held == 0
    await settle()
    assert h.kill.calls == []
    assert h.controller.phase is Phase.MIGRATING
    await h.controller.close()
    assert not await h.controller.wait(0)

