"""The phase machine: one transition table, a timestamped timeline, a bumping generation."""

from __future__ import annotations

import itertools

import pytest

from coordinator.drain.phases import TRANSITIONS, IllegalTransition, Phase, PhaseMachine
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
    for current, wanted in itertools.product(Phase, Phase):
        machine = PhaseMachine(clock=clock)
        machine.phase = current
        assert machine.can(wanted) == (wanted in TRANSITIONS[current])
    assert TRANSITIONS[Phase.DONE] == frozenset()


def test_bump_and_restore_never_go_backwards() -> None:
    machine = PhaseMachine(clock=clock)
    assert machine.bump() == 2
    timeline = list(machine.timeline)
    fresh = PhaseMachine(clock=clock)
    fresh.restore(Phase.MIGRATING, 40, timeline)
    assert fresh.phase is Phase.MIGRATING
    assert fresh.generation == 41
    assert fresh.timeline[-1].note == "resumed"
