"""The drain state machine: phases, the one transition table, and the timeline.

    serving ──► draining ──► migrating ──► terminating ──► done
       ▲           │             │
       └───────────┴─────────────┘   abort (DELETE /drain), only before terminating

Every transition is timestamped into the timeline and bumps ``generation``, the counter
routers compare to learn that ``/status`` changed.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator.errors import DrainConflict


class Phase(enum.StrEnum):
    """Where the drain is. The values are the contract's ``phase`` strings."""

    SERVING = "serving"
    """Normal operation; ``/readyz`` answers 200."""
    DRAINING = "draining"
    """A drain was requested: readiness fails, workers were told."""
    MIGRATING = "migrating"
    """Workers hand back in-flight requests; routers acknowledge them."""
    TERMINATING = "terminating"
    """The ordered graceful kill runs; no way back."""
    DONE = "done"
    """Every registered process is gone; the summary is final."""


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.SERVING: frozenset({Phase.DRAINING}),
    Phase.DRAINING: frozenset({Phase.MIGRATING, Phase.SERVING}),
    Phase.MIGRATING: frozenset({Phase.TERMINATING, Phase.SERVING}),
    Phase.TERMINATING: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}
"""The only legal moves. Going back to ``serving`` is the abort."""

_REFUSALS: dict[Phase, str] = {
    Phase.SERVING: "no drain is running",
    Phase.DRAINING: "the drain has just started",
    Phase.MIGRATING: "the drain is migrating requests",
    Phase.TERMINATING: "the drain is terminating processes and can no longer be aborted",
    Phase.DONE: "the drain is done; the coordinator will not serve again",
}


class IllegalTransition(DrainConflict):
    """A move the transition table does not allow; the message says why, by current phase."""

    def __init__(self, current: Phase, wanted: Phase) -> None:
        super().__init__(f"cannot go from {current} to {wanted}: {_REFUSALS[current]}")
        self.current = current
        self.wanted = wanted


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

    def can(self, wanted: Phase) -> bool:
        """Whether ``wanted`` is a legal next phase."""
        return wanted in TRANSITIONS[self.phase]

    def advance(self, wanted: Phase, note: str = "") -> Transition:
        """Move to ``wanted`` or raise ``IllegalTransition``; timestamp it and bump."""
        if not self.can(wanted):
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
