"""The worker state table: every move from every state, as the service applies them."""

from __future__ import annotations

import pytest

from coordinator.service.worker_moves import MOVES, WorkerMove, WorkerState, after

S, D, DD, T, X = (WorkerState.SERVING, WorkerState.DRAINING, WorkerState.DRAINED,
                  WorkerState.TERMINATING, WorkerState.EXITED)

EXPECTED = {
    WorkerMove.DRAIN: {S: D, D: D, DD: DD, T: T, X: X},
    WorkerMove.IDLE: {S: S, D: DD, DD: DD, T: T, X: X},
    WorkerMove.ABORT: {S: S, D: S, DD: S, T: T, X: X},
    WorkerMove.TERMINATE: {S: T, D: T, DD: T, T: T, X: X},
    WorkerMove.EXIT: {S: X, D: X, DD: X, T: X, X: X},
}


@pytest.mark.parametrize("move", list(WorkerMove))
def test_each_move_from_each_state(move: WorkerMove) -> None:
    assert {state: after(state, move) for state in WorkerState} == EXPECTED[move]


def test_an_exited_worker_never_moves_again_and_every_move_is_in_the_table() -> None:
    assert set(MOVES) == set(WorkerMove)
    assert all(X not in table for table in MOVES.values())
