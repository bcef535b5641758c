"""A worker's states and the moves between them, as one table (what ``/status`` shows as a
worker's ``state``; the drain's own phases are ``coordinator.drain.phases``).

    serving ──drain──▶ draining ──idle──▶ drained
       ▲                  │                  │
       └──────abort───────┴──────abort───────┘
    serving, draining, drained ──terminate──▶ terminating
    any ──exit──▶ exited

A move not in the table leaves the state as it is (a second ``drain`` of a draining worker,
``terminate`` of a worker already terminating): the events that cause them may repeat.
"""

from __future__ import annotations

import enum
from typing import Protocol

import shutdown_wire as wire


class WorkerState(enum.StrEnum):
    """A worker's state as ``/status`` shows it (the strings: ``shutdown_wire``)."""

    SERVING = wire.WORKER_SERVING
    """Registered; takes new work."""
    DRAINING = wire.WORKER_DRAINING
    """Told to drain; may still hold in-flight requests."""
    DRAINED = wire.WORKER_DRAINED
    """Reported zero in-flight requests during a drain."""
    TERMINATING = wire.WORKER_TERMINATING
    """Told the kill is about to start."""
    EXITED = wire.WORKER_EXITED
    """Its process is gone."""


class HasState(Protocol):
    state: WorkerState


class WorkerMove(enum.StrEnum):
    """What happened to a worker."""

    DRAIN = "drain"
    """A drain started (or the worker registered during one)."""
    IDLE = "idle"
    """It reported no request in flight during a drain."""
    ABORT = "abort"
    """The drain was aborted: serving again."""
    TERMINATE = "terminate"
    """The kill is about to start (its pre-kill hooks run now)."""
    EXIT = "exit"
    """Its process is gone."""


_ALIVE = (WorkerState.SERVING, WorkerState.DRAINING, WorkerState.DRAINED,
          WorkerState.TERMINATING)

MOVES: dict[WorkerMove, dict[WorkerState, WorkerState]] = {
    WorkerMove.DRAIN: {WorkerState.SERVING: WorkerState.DRAINING},
    WorkerMove.IDLE: {WorkerState.DRAINING: WorkerState.DRAINED},
    WorkerMove.ABORT: {WorkerState.DRAINING: WorkerState.SERVING,
                       WorkerState.DRAINED: WorkerState.SERVING},
    WorkerMove.TERMINATE: {s: WorkerState.TERMINATING for s in _ALIVE},
    WorkerMove.EXIT: {s: WorkerState.EXITED for s in _ALIVE},
}
"""For each move, the state it leads to from each state it applies to."""


def after(state: WorkerState, move: WorkerMove) -> WorkerState:
    """The state ``move`` leads to from ``state`` (``state`` itself when it does not apply)."""
    return MOVES[move].get(state, state)


def apply(worker: HasState, move: WorkerMove) -> None:
    worker.state = after(worker.state, move)
