"""The leader's side of a group: who announced itself, what each follower reported, and the
document followers long-poll (``GET /group``).

    1. a follower announces itself (``POST /group/members``): listed from then on;
    2. any member's drain reaches the leader as an ordinary ``POST /drain`` (no PID, no
       pattern: the leader drains its own pod, as for any caller);
    3. followers long-poll ``GET /group``; ``engine_stopped`` turns true once the leader's
       own drain is done (its engine, rank 0 with it, has stopped): their kills may run;
    4. each follower reports its summary (``POST /group/members/{index}/summary``); the
       group summary merges them with the leader's own drain (``summary.merge``).

A new drain of the leader forgets the reports of the one before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator.drain.phases import Phase
from coordinator.drain.record import DrainRecord
from coordinator.errors import DrainConflict
from coordinator.group.membership import Membership
from coordinator.group.summary import PodReport, merge, own_report


@dataclass
class MemberEntry:
    """One follower as the leader knows it."""

    index: int
    url: str | None
    announced_at: float
    report: PodReport | None = None

    def to_status(self) -> dict[str, Any]:
        return {"index": self.index, "url": self.url, "announced_at": self.announced_at,
                "reported": self.report is not None,
                "outcome": self.report.outcome if self.report else None,
                "mode": self.report.mode if self.report else None}

    def to_record(self) -> dict[str, Any]:
        return {"index": self.index, "url": self.url, "announced_at": self.announced_at,
                "report": self.report.to_dict() if self.report else None}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> MemberEntry:
        report = data.get("report")
        return cls(index=int(data["index"]), url=data.get("url"),
                   announced_at=float(data["announced_at"]),
                   report=PodReport.from_dict(report) if report else None)


class LeaderBook:
    """The followers of one leader (single event loop, no locks)."""

    def __init__(self, membership: Membership, on_change: Callable[[], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.membership = membership
        self._on_change = on_change
        self._clock = clock
        self.members: dict[int, MemberEntry] = {}

    def _check_index(self, index: int) -> None:
        if index not in self.membership.followers:
            raise GroupInputError(
                f"member index {index} is not a follower of this group of "
                f"{self.membership.size} (1 to {self.membership.size - 1})")

    def announce(self, index: int, url: str | None) -> MemberEntry:
        """Step 1: list (or refresh) follower ``index``."""
        self._check_index(index)
        entry = self.members.get(index)
        if entry is None:
            entry = self.members[index] = MemberEntry(index, url, self._clock())
        else:
            entry.url = url
        self._on_change()
        return entry

    def report(self, index: int, report: PodReport, drain: DrainRecord | None,
               phase: Phase) -> None:
        """Step 4: follower ``index``'s summary (``DrainConflict`` while no drain of the
        leader runs or ran: there is no group drain to report on)."""
        self._check_index(index)
        if drain is None or phase is Phase.SERVING:
            raise DrainConflict("the leader has no group drain to report on")
        entry = self.members.get(index) or MemberEntry(index, None, self._clock())
        entry.report = report
        self.members[index] = entry
        self._on_change()

    def new_drain(self) -> None:
        """Forget the reports of the drain before."""
        for entry in self.members.values():
            entry.report = None

    def summary(self, drain: DrainRecord | None, phase: Phase) -> dict[str, Any]:
        """The group summary: the leader's own drain (once done) and every report."""
        reports = {i: e.report for i, e in self.members.items() if e.report is not None}
        if drain is not None and phase is Phase.DONE:
            reports[0] = own_report(0, drain.outcome, drain.causes, drain.outcomes.values())
        return merge(self.membership.size, reports)

    def document(self, *, instance: str, phase: Phase, generation: int,
                 drain: DrainRecord | None) -> dict[str, Any]:
        """What ``GET /group`` answers on the leader (step 3)."""
        current = drain if phase is not Phase.SERVING else None
        return {
            "instance": instance,
            "index": self.membership.index,
            "size": self.membership.size,
            "phase": phase.value,
            "generation": generation,
            "drain": ({"reason": current.reason, "started_at": current.deadlines.started_at,
                       "deadline_at": current.deadlines.deadline_at}
                      if current is not None else None),
            "engine_stopped": current is not None and phase is Phase.DONE,
            "members": [e.to_status() for _, e in sorted(self.members.items())],
            "summary": self.summary(current, phase),
        }

    def to_record(self) -> dict[str, Any]:
        return {"members": [e.to_record() for _, e in sorted(self.members.items())]}

    def restore(self, record: dict[str, Any]) -> None:
        entries = [MemberEntry.from_record(m) for m in record.get("members") or ()]
        for entry in entries:
            self._check_index(entry.index)
        self.members = {e.index: e for e in entries}


class GroupInputError(ValueError):
    """A peer's message that does not fit this group (answered 422)."""
