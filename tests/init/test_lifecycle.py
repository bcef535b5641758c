"""The engine's init as data: its moves, its exit statuses, its signals (pure, no process)."""

from __future__ import annotations

import signal

import pytest

from coordinator.init.lifecycle import (
    FORWARDED,
    MOVES,
    IllegalMove,
    Move,
    State,
    after,
    describe,
    exit_status,
    forwarded,
    parse_signal,
)


def test_every_state_is_reached_and_done_is_final() -> None:
    """1. From RUNNING, the moves reach every state. 2. DONE has no move out. 3. A move the
    table does not hold is refused, naming the move and the state."""
    reached = {State.RUNNING}
    frontier = [State.RUNNING]
    while frontier:
        state = frontier.pop()
        for (source, _), target in MOVES.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)
    assert not [move for (source, move) in MOVES if source is State.DONE]
    with pytest.raises(IllegalMove, match="'drain' while done"):
        after(State.DONE, Move.DRAIN)
    with pytest.raises(IllegalMove):
        after(State.ENDING, Move.ABORTED)  # too late to take the pod back


def test_a_drain_ends_in_done_only_through_ending() -> None:
    """The stop signal's path and a crash's path: both end every process first (ENDING)."""
    assert after(after(after(State.RUNNING, Move.DRAIN), Move.DRAIN_DONE),
                 Move.ALL_REAPED) is State.DONE
    assert after(after(State.RUNNING, Move.MAIN_EXITED), Move.ALL_REAPED) is State.DONE
    assert after(after(State.RUNNING, Move.DRAIN), Move.ABORTED) is State.RUNNING


@pytest.mark.parametrize(("code", "status", "words"), [
    (0, 0, "exited 0"), (3, 3, "exited 3"), (255, 255, "exited 255"),
    (-signal.SIGTERM, 143, "killed by SIGTERM"), (-signal.SIGKILL, 137, "killed by SIGKILL"),
    (-signal.SIGSEGV, 139, "killed by SIGSEGV")])
def test_exit_status_as_shells_and_tini_report_it(code: int, status: int, words: str) -> None:
    assert exit_status(code) == status
    assert describe(code) == words


def test_the_stop_signal_is_never_forwarded_and_nothing_synchronous_is() -> None:
    """1. The stop signal is left out of what is forwarded; SIGTERM is forwarded when
    another signal stops. 2. SIGKILL, SIGSTOP, SIGCHLD and the synchronous signals can
    neither be forwarded nor stop the init."""
    assert signal.SIGTERM not in forwarded(signal.SIGTERM)
    assert signal.SIGTERM in forwarded(signal.SIGINT)
    assert signal.SIGINT not in forwarded(signal.SIGINT)
    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGSEGV,
                signal.SIGTSTP):
        assert sig not in FORWARDED
        with pytest.raises(ValueError, match="cannot be the stop signal"):
            parse_signal(sig.name)
    assert describe(None) == "unknown"
