"""The phase machine: one transition table, a timestamped timeline, a bumping generation."""

from __future__ import annotations

import itertools

import pytest

from coordinator.drain.phases import (
    TRANSITIONS,
    IllegalTransition,
    Move,
    Phase,
    PhaseMachine,
    allowed,
)
from coordinator.errors import DrainConflict


def clock() -> float:
    return float(next(_ticks))


_ticks = itertools.count(100)


def test_the_happy_path_is_timestamped_and_bumps_generation() -> None:
    """1. walk serving → draining → migrating → terminating → done;
    2. every step is in the timeline with its own time and generation."""
    seen: list[int] = []
    machine = PhaseMachine(clock=clock, on_change=seen.append)
    for phase in (Phase.DRAINING, Phase.MIGRATING, Phase.TERMINATING, Phase.DONE):
        machine.advance(phase)
    assert [t.phase for t in machine.timeline] == list(Phase)
    assert [t.generation for t in machine.timeline] == [1, 2, 3, 4, 5]
    assert seen == [2, 3, 4, 5]
    times = [t.at for t in machine.timeline]
    assert times == sorted(times)


@pytest.mark.parametrize("where", [Phase.DRAINING, Phase.MIGRATING])
def test_abort_returns_to_serving_before_terminating(where: Phase) -> None:
    machine = PhaseMachine(clock=clock)
    machine.advance(Phase.DRAINING)
    if where is Phase.MIGRATING:
        machine.advance(Phase.MIGRATING)
    machine.advance(Phase.SERVING, note="aborted")
    assert machine.phase is Phase.SERVING
    assert machine.timeline[-1].note == "aborted"


def test_illegal_moves_raise_a_message_keyed_by_state() -> None:
    machine = PhaseMachine(clock=clock)
    for phase in (Phase.DRAINING, Phase.MIGRATING, Phase.TERMINATING):
        machine.advance(phase)
    with pytest.raises(IllegalTransition, match="can no longer be aborted") as info:
        machine.advance(Phase.SERVING)
    assert isinstance(info.value, DrainConflict)
    assert machine.phase is Phase.TERMINATING
    with pytest.raises(IllegalTransition, match="no drain is running"):
        PhaseMachine(clock=clock).advance(Phase.DONE)


def test_every_pair_not_in_the_table_is_refused() -> None:
    """Without a named move, a pair is legal when the table has it and its move is not
    explicit; naming a move allows exactly the pair the table gives that move."""
    for current, wanted in itertools.product(Phase, Phase):
        machine = PhaseMachine(clock=clock)
        machine.phase = current
        move = TRANSITIONS[current].get(wanted)
        assert machine.can(wanted) == (move is not None and not move.explicit)
        for named in Move:
            assert allowed(current, wanted, named) == (move is named)
    assert TRANSITIONS[Phase.DONE] == {Phase.SERVING: Move.NEW_CYCLE}


def _done() -> PhaseMachine:
    machine = PhaseMachine(clock=clock)
    for phase in (Phase.DRAINING, Phase.MIGRATING, Phase.TERMINATING, Phase.DONE):
        machine.advance(phase)
    return machine


def test_a_done_drain_is_not_aborted_by_a_plain_move_to_serving() -> None:
    """1. finish a drain; 2. advance(serving) without naming the move (what an abort does)
    is refused with the done refusal; 3. the phase stays done."""
    machine = _done()
    with pytest.raises(IllegalTransition, match="the drain is done"):
        machine.advance(Phase.SERVING, note="aborted")
    assert machine.phase is Phase.DONE


def test_the_new_cycle_goes_from_done_to_serving_only() -> None:
    """1. the new cycle from done reaches serving, timestamped with its note; 2. a new drain
    can start from there; 3. naming the new cycle anywhere but done is refused (it never
    aborts a running drain)."""
    machine = _done()
    entry = machine.advance(Phase.SERVING, note="new cycle", move=Move.NEW_CYCLE)
    assert machine.phase is Phase.SERVING
    assert (entry.phase, entry.note) == (Phase.SERVING, "new cycle")
    assert machine.timeline[-1] == entry
    machine.advance(Phase.DRAINING)
    with pytest.raises(IllegalTransition):
        machine.advance(Phase.SERVING, move=Move.NEW_CYCLE)
    assert machine.timeline[-1].phase is Phase.DRAINING
    assert machine.advance(Phase.SERVING, move=Move.ABORT).phase is Phase.SERVING


def test_bump_and_restore_never_go_backwards() -> None:
    machine = PhaseMachine(clock=clock)
    assert machine.bump() == 2
    timeline = list(machine.timeline)
    fresh = PhaseMachine(clock=clock)
    fresh.restore(Phase.MIGRATING, 40, timeline)
    assert fresh.phase is Phase.MIGRATING
    assert fresh.generation == 41
    assert fresh.timeline[-1].note == "resumed"
