"""One drain as data: its settings (``DrainConfig``) and its record (``DrainRecord``): why and
when it started, its deadlines, and once over, its outcome and every process's fate. The
record is what ``/status`` shows and what the state file keeps."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from coordinator.drain.budget import BudgetSplit, Deadlines, anchor
from coordinator.kill.membership import escapes
from coordinator.kill.report import ProcessOutcome

OutcomeKey = tuple[int, float | None]
"""A process of a drain: its PID and start time (a reused PID is another process)."""


@dataclass(frozen=True)
class DrainConfig:
    """The settings a drain is planned with."""

    budget_s: float
    tier_timeout_s: float
    confirm_s: float
    termination_share: float = 0.4
    min_drain_s: float = 0.0
    prekill_timeout_s: float = 2.0
    kill_signal: int = signal.SIGTERM
    main_exit_s: float = 0.0
    """Seconds the engine's main process needs from its graceful signal to its exit (its
    profile's, ``coordinator.engines``): the termination share always fits it."""
    engine_kills: str = ""
    """What the engine SIGKILLs of its own tree when it stops, and what ends it cleanly (its
    profile's): said of a process that died so (``coordinator.drain.outcome``)."""


@dataclass
class DrainRecord:
    """One drain: why, when, and its deadlines (epoch seconds, so a restart keeps them)."""

    reason: str
    split: BudgetSplit
    deadlines: Deadlines
    outcome: str | None = None
    """Once it ended: ``graceful``, ``aborted``, or the word ``coordinator.drain.outcome``
    judges for what went wrong (``survived``, ``killed``, ``signalled``, ...)."""
    causes: list[str] = field(default_factory=list)
    """Why the outcome is not graceful: one plain sentence per cause."""
    lost_requests: int = 0
    """Requests whose clients were cut off: handoffs of this drain that no router
    acknowledged, and ``cut_requests``."""
    cut_requests: int = 0
    """Requests an engine that does not register still had in flight (its own gauges, at
    their last read before its processes ended) when the kill ended it: streams the kill
    cut."""
    ended_requests: int = 0
    """Streams of an engine that does not register that the drain ended through the engine's
    own API for the proxy in front to continue (``--end-streams``, the engine's count)."""
    continued_requests: int = 0
    """Of ``ended_requests``: those the proxy acknowledged taking over (handed to it, not
    lost); the rest are in ``cut_requests``."""
    errors: list[str] = field(default_factory=list)
    """Internal failures during the drain (each one also in the log); the drain went on."""
    expired_before: int | None = None
    """The migration book's expired count when the drain started (its own count is the
    difference), kept across a restart."""
    ended_at: float | None = None
    kill: dict[str, Any] | None = None
    """The kill report's header (mode, exit detection, notes), once the kill ran."""
    outcomes: dict[OutcomeKey, ProcessOutcome] = field(default_factory=dict)
    force: bool = False
    """An operator asked for a force drain (from the start, or by escalation)."""

    def to_status(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "started_at": self.deadlines.started_at,
            "deadline_at": self.deadlines.deadline_at,
            "migration_deadline_at": self.deadlines.migration_deadline_at,
            "min_drain_until": self.deadlines.min_drain_until,
            "budget_s": self.split.total_s,
            "migration_s": self.split.migration_s,
            "termination_s": self.split.termination_s,
            "outcome": self.outcome,
            "causes": list(self.causes),
            "lost_requests": self.lost_requests,
            "cut_requests": self.cut_requests,
            "ended_requests": self.ended_requests,
            "continued_requests": self.continued_requests,
            "errors": list(self.errors),
            "ended_at": self.ended_at,
            "force": self.force,
            "escapes": escapes((self.kill or {}).get("unwatched_roots") or []),
        }

    def to_record(self) -> dict[str, Any]:
        status = self.to_status()
        del status["escapes"]  # derived from ``kill``, which the record keeps
        return {
            **status,
            "expired_before": self.expired_before,
            "min_drain_s": self.split.min_drain_s,
            "kill": self.kill,
            "outcomes": [o.to_dict() for o in self.outcomes.values()],
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> DrainRecord:
        split = BudgetSplit(float(data["budget_s"]), float(data["migration_s"]),
                            float(data["termination_s"]), float(data.get("min_drain_s", 0.0)))
        outcomes = [ProcessOutcome.from_dict(o) for o in data.get("outcomes", ())]
        return cls(
            reason=str(data["reason"]), split=split,
            deadlines=anchor(split, float(data["started_at"])),
            outcome=data.get("outcome"), ended_at=data.get("ended_at"), kill=data.get("kill"),
            outcomes={(o.pid, o.start_time): o for o in outcomes},
            force=bool(data.get("force", False)),
            causes=[str(c) for c in data.get("causes") or ()],
            lost_requests=int(data.get("lost_requests") or 0),
            cut_requests=int(data.get("cut_requests") or 0),
            ended_requests=int(data.get("ended_requests") or 0),
            continued_requests=int(data.get("continued_requests") or 0),
            errors=[str(e) for e in data.get("errors") or ()],
            expired_before=(None if data.get("expired_before") is None
                            else int(data["expired_before"])),
        )
