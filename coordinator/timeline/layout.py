"""Which rows the timeline has, in order: pure, from a ``Timeline``.

One group per root (a registered worker's process tree or an adopted one), its rows in the
kill's order: tiers by when they were signalled (the tier never signalled last), and within
a tier deepest first, then by PID. Up to ``COLLAPSE_AFTER`` processes every process has a
row of its own; past that each tier of each group is one row (with counts by fate), so
2,000 processes stay a page one can read.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from coordinator.timeline.model import Process, Timeline, Worker

COLLAPSE_AFTER = 300
"""Most processes drawn one row each; more are drawn one row per tier."""
MAX_TIER_ROWS = 400
"""Most rows drawn when collapsed (tiers of all groups); the rest are counted in a note."""


@dataclass
class Tier:
    name: str
    processes: list[Process]


@dataclass
class Group:
    root_pid: int | None
    worker: Worker | None
    tiers: list[Tier] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(t.processes) for t in self.tiers)


def groups(timeline: Timeline) -> list[Group]:
    """The groups of ``timeline``, by root PID (processes with no root last)."""
    by_root: dict[int | None, list[Process]] = defaultdict(list)
    for process in timeline.processes:
        by_root[process.root_pid].append(process)
    workers = {w.pid: w for w in timeline.workers if w.pid is not None}
    for pid in workers:
        by_root.setdefault(pid, [])
    ordered = sorted(by_root, key=lambda root: (root is None, root or 0))
    return [Group(root, workers.get(root) if root is not None else None,
                  _tiers(by_root[root])) for root in ordered]


def _tiers(processes: list[Process]) -> list[Tier]:
    by_tier: dict[str, list[Process]] = defaultdict(list)
    for process in processes:
        by_tier[process.tier].append(process)

    def order(name: str) -> tuple[float, int, str]:
        members = by_tier[name]
        signalled = [p.signalled_at for p in members if p.signalled_at is not None]
        deepest = max((p.depth or 0 for p in members), default=0)
        return (min(signalled) if signalled else math.inf, -deepest, name)

    return [Tier(name, sorted(by_tier[name], key=lambda p: (-(p.depth or 0), p.pid)))
            for name in sorted(by_tier, key=order)]


def collapsed(timeline: Timeline) -> bool:
    """Whether the rows are one per tier rather than one per process."""
    return len(timeline.processes) > COLLAPSE_AFTER
