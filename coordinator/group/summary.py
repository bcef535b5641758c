"""One summary for the whole group: every process of every pod (its pod, pid, fate, exit
code) and each pod's outcome, merged on the leader from its own drain and what each
follower reported. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.kill.report import ProcessOutcome

GRACEFUL = "graceful"
MODE_GROUP = "group"
"""The pod drained with its group (its kill waited for the leader's engine)."""
MODE_LOCAL = "local"
"""The pod drained on its own: its leader could not be reached."""


@dataclass(frozen=True)
class PodReport:
    """What one pod says of its drain (the leader's own, or a follower's report)."""

    index: int
    outcome: str | None
    mode: str = MODE_GROUP
    reason: str | None = None
    causes: tuple[str, ...] = ()
    processes: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """``{"pid", "name", "role", "fate", "exit_code"}`` each."""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "outcome": self.outcome, "mode": self.mode,
                "reason": self.reason, "causes": list(self.causes),
                "processes": [dict(p) for p in self.processes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodReport:
        return cls(index=int(data["index"]), outcome=data.get("outcome"),
                   mode=str(data.get("mode") or MODE_GROUP), reason=data.get("reason"),
                   causes=tuple(str(c) for c in data.get("causes") or ()),
                   processes=tuple(process_entry(p) for p in data.get("processes") or ()))


def process_entry(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a process the group summary keeps."""
    return {"pid": int(data["pid"]), "name": str(data.get("name") or ""),
            "role": data.get("role"), "fate": str(data["fate"]),
            "exit_code": data.get("exit_code")}


def own_report(index: int, outcome: str | None, causes: Iterable[str],
               outcomes: Iterable[ProcessOutcome], mode: str = MODE_GROUP,
               reason: str | None = None) -> PodReport:
    """A pod's report from its own drain's record."""
    processes = tuple(process_entry(o.to_dict()) for o in sorted(outcomes, key=lambda o: o.pid))
    return PodReport(index=index, outcome=outcome, mode=mode, reason=reason,
                     causes=tuple(causes), processes=processes)


def merge(size: int, reports: Mapping[int, PodReport]) -> dict[str, Any]:
    """The group summary of ``size`` pods from the reports known so far.

    ``complete``: every pod reported. ``outcome``: the first pod's (in index order) that is
    not graceful; ``graceful`` once every pod reported graceful; None while it cannot be
    told yet (nothing but graceful so far, some pods still to report)."""
    pods: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for index in range(size):
        report = reports.get(index)
        if report is None:
            pods.append({"index": index, "reported": False, "outcome": None, "mode": None,
                         "reason": None, "causes": []})
            continue
        pods.append({"index": index, "reported": True, "outcome": report.outcome,
                     "mode": report.mode, "reason": report.reason,
                     "causes": list(report.causes)})
        processes += [{"pod": index, **p} for p in report.processes]
    complete = all(p["reported"] for p in pods)
    bad = [p["outcome"] for p in pods if p["reported"] and p["outcome"] != GRACEFUL]
    outcome = bad[0] if bad else (GRACEFUL if complete else None)
    return {"complete": complete, "outcome": outcome, "pods": pods, "processes": processes}
