"""One drain of the chaos soak (``bench/soak.py``), as checked: its streams tallied against
the engines' tokens, what was left, what the summary said untruly, and its report line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from devstack.streaming_load import ClientStream


@dataclass
class DrainResult:
    """One drain, as checked."""

    number: int
    pod: str
    kind: str
    started: float = field(default_factory=time.monotonic, repr=False)
    seconds: float = 0.0
    """The whole cycle: load, drain, checks, the next engine up."""
    requests: int = 0
    lost: int = 0
    """Streams of this drain's load that did not complete, while no force or crash drain
    ran anywhere."""
    lost_allowed: int = 0
    """The same, while a force or crash drain ran (of this pod or another): allowed."""
    tokens_missing: int = 0
    tokens_duplicated: int = 0
    inexact: int = 0
    """Completed streams whose tokens are all there but not in order."""
    outcome: str | None = None
    unexpected: bool = False
    """The outcome is not the one this kind calls for."""
    left: list[str] = field(default_factory=list)
    untruthful: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the start of the drain's cycle to each step."""

    def mark(self, phase: str) -> None:
        self.phases[phase] = time.monotonic() - self.started

    def token_damage(self) -> bool:
        return bool(self.tokens_missing or self.tokens_duplicated or self.inexact)

    def findings(self) -> bool:
        return bool(self.lost or self.token_damage() or self.left or self.untruthful
                    or self.errors or self.unexpected)

    def tally(self, streams: list[ClientStream], *, loss_allowed: bool) -> None:
        self.requests = len(streams)
        for s in streams:
            if not s.done:
                if loss_allowed:
                    self.lost_allowed += 1
                else:
                    self.lost += 1
                continue
            missing, duplicated = s.missing_duplicated()
            self.tokens_missing += missing
            self.tokens_duplicated += duplicated
            self.inexact += not missing and not duplicated and not s.exact

    def line(self) -> str:
        flags = [f"{len(self.left)} left"] if self.left else []
        flags += ["UNTRUE"] if self.untruthful else []
        flags += ["UNEXPECTED OUTCOME"] if self.unexpected else []
        flags += [f"{len(self.errors)} errors"] if self.errors else []
        flags += [f"{self.lost} lost"] if self.lost else []
        flags += [f"tokens {self.tokens_missing} missing, {self.tokens_duplicated} duplicated, "
                  f"{self.inexact} streams out of order"] if self.token_damage() else []
        steps = " ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        return (f"[{self.number:5d}] {self.pod} {self.kind:<20} {self.seconds:5.1f} s "
                f"{self.outcome or '-':<10} {self.requests - self.lost}/{self.requests} streams"
                f"  ({steps})" + (f"  ** {', '.join(flags)}" if flags else ""))
