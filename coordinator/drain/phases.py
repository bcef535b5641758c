"""The drain state machine: phases, the one transition table, and the timeline.

    serving ──► draining ──► migrating ──► terminating ──► done
       ▲           │             │                           │
       ├───────────┴─────────────┘   abort (DELETE /drain),  │
       │                             only before terminating │
       └─────────────────────────────────────────────────────┘   new cycle

A finished drain ends a cycle: ``done`` goes back to ``serving`` when a new engine registers,
or when a restarted coordinator finds the drain's processes gone. That move is ``explicit``:
only a caller naming it (``advance(SERVING, move=Move.NEW_CYCLE)``) takes it, so a plain
``advance(SERVING)`` (the abort) is still refused once the drain is done.

Every transition is timestamped into the timeline and bumps ``generation``, the counter
routers compare to learn that ``/status`` changed.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import shutdown_wire as wire
from coordinator.errors import DrainConflict


class Phase(enum.StrEnum):
    """Where the drain is. The values are the contract's ``phase`` strings (``shutdown_wire``)."""

    SERVING = wire.PHASE_SERVING
    """Normal operation; ``/readyz`` answers 200."""
    DRAINING = wire.PHASE_DRAINING
    """A drain was requested: readiness fails, workers were told."""
    MIGRATING = wire.PHASE_MIGRATING
    """Workers hand back in-flight requests; routers acknowledge them."""
    TERMINATING = wire.PHASE_TERMINATING
    """The ordered graceful kill runs; no way back."""
    DONE = wire.PHASE_DONE
    """Every registered process is gone; the summary is final."""

    @property
    def draining(self) -> bool:
        """A drain is in progress: past ``serving``, not yet ``done``."""
        return self in (Phase.DRAINING, Phase.MIGRATING, Phase.TERMINATING)

    @property
    def before_kill(self) -> bool:
        """A drain runs and nothing is signalled yet (``draining`` or ``migrating``): it can
        still be aborted, and workers still hand requests back."""
        return self in (Phase.DRAINING, Phase.MIGRATING)

    @property
    def killing_or_done(self) -> bool:
        """The kill has started (``terminating``) or ended (``done``): the process list is the
        kill's, workers are no longer asked anything."""
        return self in (Phase.TERMINATING, Phase.DONE)

    @property
    def idle(self) -> bool:
        """No drain runs (``serving``, or ``done`` until the next cycle)."""
        return self in (Phase.SERVING, Phase.DONE)


class Move(enum.StrEnum):
    """What a transition means (the timeline's notes say why it happened)."""

    START = "start"
    MIGRATE = "migrate"
    TERMINATE = "terminate"
    FINISH = "finish"
    ABORT = "abort"
    NEW_CYCLE = "new cycle"

    @property
    def explicit(self) -> bool:
        """Taken only by a caller that names it: ``advance(..., move=self)``."""
        return self is Move.NEW_CYCLE


TRANSITIONS: dict[Phase, dict[Phase, Move]] = {
    Phase.SERVING: {Phase.DRAINING: Move.START},
    Phase.DRAINING: {Phase.MIGRATING: Move.MIGRATE, Phase.SERVING: Move.ABORT},
    Phase.MIGRATING: {Phase.TERMINATING: Move.TERMINATE, Phase.SERVING: Move.ABORT},
    Phase.TERMINATING: {Phase.DONE: Move.FINISH},
    Phase.DONE: {Phase.SERVING: Move.NEW_CYCLE},
}
"""The only legal moves, each with its meaning. Going back to ``serving`` before
``terminating`` is the abort; from ``done`` it is the next cycle."""

_REFUSALS: dict[Phase, str] = {
    Phase.SERVING: "no drain is running",
    Phase.DRAINING: "the drain has just started",
    Phase.MIGRATING: "the drain is migrating requests",
    Phase.TERMINATING: "the drain is terminating processes and can no longer be aborted",
    Phase.DONE: "the drain is done and processes were terminated; the next cycle starts "
                "when a new worker registers",
}


class IllegalTransition(DrainConflict):
    """A move the transition table does not allow; the message says why, by current phase."""

    def __init__(self, current: Phase, wanted: Phase) -> None:
        super().__init__(f"cannot go from {current} to {wanted}: {_REFUSALS[current]}")
        self.current = current
        self.wanted = wanted


def allowed(current: Phase, wanted: Phase, move: Move | None = None) -> bool:
    """Whether the table lets ``current`` go to ``wanted``: an explicit move only when
    ``move`` names it, and a named ``move`` only when it is the table's move for the pair."""
    found = TRANSITIONS[current].get(wanted)
    if found is None:
        return False
    if move is not None:
        return found is move
    return not found.explicit


@dataclass(frozen=True)
class Transition:
    """One entry of the timeline (epoch seconds)."""

    phase: Phase
    at: float
    generation: int
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "at": self.at, "generation": self.generation,
                "note": self.note}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transition:
        return cls(Phase(data["phase"]), float(data["at"]), int(data["generation"]),
                   str(data.get("note", "")))


class PhaseMachine:
    """Holds the current phase, the generation counter and the timeline.

    ``generation`` also bumps for changes that are not transitions (a worker registered, a
    migration acknowledged) through ``bump()``; ``on_change`` is called after every bump so
    the owner can invalidate caches and wake long-pollers.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_change = on_change
        self.phase = Phase.SERVING
        self.generation = 1
        self.timeline: list[Transition] = [Transition(Phase.SERVING, clock(), 1, "started")]

    def can(self, wanted: Phase, move: Move | None = None) -> bool:
        """Whether ``wanted`` is a legal next phase (see ``allowed``)."""
        return allowed(self.phase, wanted, move)

    def advance(self, wanted: Phase, note: str = "", *, move: Move | None = None) -> Transition:
        """Move to ``wanted`` or raise ``IllegalTransition``; timestamp it and bump.

        ``move`` names the transition; it is needed for an explicit one (the new cycle)."""
        if not self.can(wanted, move):
            raise IllegalTransition(self.phase, wanted)
        self.phase = wanted
        self.generation += 1
        entry = Transition(wanted, self._clock(), self.generation, note)
        self.timeline.append(entry)
        self._notify()
        return entry

    def bump(self) -> int:
        """Record a change that is not a transition; returns the new generation."""
        self.generation += 1
        self._notify()
        return self.generation

    def restore(self, phase: Phase, generation: int, timeline: list[Transition]) -> None:
        """Take over a persisted state after a restart (generation never goes backwards)."""
        self.phase = phase
        self.generation = max(self.generation, generation) + 1
        self.timeline = [*timeline, Transition(phase, self._clock(), self.generation, "resumed")]
        self._notify()

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change(self.generation)
