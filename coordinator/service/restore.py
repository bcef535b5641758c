"""From a validated state file to the objects a restarted coordinator takes over, and the
check that ends a finished drain's cycle.

``build`` turns the whole document into objects (workers, migrations, drains, timeline)
without touching the running coordinator, so a document that fails here is set aside as
corrupt like one that failed validation, and nothing of it is applied. ``still_running``
tells which processes a finished drain left behind still exist (same PID and start time).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.drain.phases import Phase, Transition
from coordinator.drain.record import DrainRecord
from coordinator.kill import patterns, procfs
from coordinator.kill.identity import same_start
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.service.migrations import MigrationBook
from coordinator.service.registry import Worker


@dataclass
class RestoredState:
    """Everything a state file holds, as objects, before any of it is applied."""

    phase: Phase
    generation: int
    timeline: list[Transition]
    workers: list[Worker]
    migrations: MigrationBook
    drain: DrainRecord | None
    """The drain of ``phase`` (None while serving)."""
    last: DrainRecord | None
    """The drain before it (shown as ``last_drain``)."""
    group: dict[str, Any] | None = None
    """This pod's part in a group drain (``coordinator.group``), when it is in a group."""
    notes: list[str] = field(default_factory=list)
    """What was repaired on the way in (a tier pattern that does not compile, dropped)."""


def build(document: dict[str, Any]) -> RestoredState:
    """Objects of a document ``state_schema.validate`` accepted; raises (``KeyError``,
    ``ValueError``, ``TypeError``) when one cannot be made, having changed nothing."""
    migrations = MigrationBook()
    migrations.restore(document["migrations"])
    phase = Phase(document["phase"])
    drain = document["drain"]
    last = document.get("last")
    group = document.get("group")
    if group is not None:  # a group's record: checked by the group's own code
        from coordinator.group.node import check_record

        check_record(group)
    notes: list[str] = []
    workers = [_usable_tiers(Worker.from_record(w), notes) for w in document["workers"]]
    return RestoredState(
        phase=phase,
        generation=int(document["generation"]),
        timeline=[Transition.from_dict(t) for t in document["timeline"]],
        workers=workers,
        migrations=migrations,
        drain=DrainRecord.from_record(drain) if drain is not None else None,
        last=DrainRecord.from_record(last) if last is not None else None,
        group=group,
        notes=notes,
    )


def _usable_tiers(worker: Worker, notes: list[str]) -> Worker:
    """``worker`` with every tier pattern RE2 accepts; one that it does not is dropped from
    its tier (which then holds what its roles name: the rest is stopped in the default
    order), and ``notes`` says so. A pattern the registration's check once passed can still
    fail here (an edited file, another RE2), and must not stop the kill."""
    usable = []
    for tier in worker.tiers:
        if tier.pattern is not None:
            try:
                patterns.compile_pattern(tier.pattern)
            except patterns.PatternError as exc:
                notes.append(f"worker {worker.id} (pid {worker.pid}): tier {tier.name!r} "
                             f"dropped its pattern: {exc}")
                tier = replace(tier, pattern=None)
        usable.append(tier)
    worker.tiers = tuple(usable)
    return worker


def is_running(pid: int, start_time: float | None) -> bool:
    """Whether the process ``pid`` that started at ``start_time`` still exists (a zombie
    does not: it has ended and only waits to be reaped)."""
    stat = procfs.read_stat(pid)
    return stat is not None and not stat.zombie and \
        same_start(stat.start_time(procfs.boot_time()), start_time)


def still_running(drain: DrainRecord) -> list[ProcessOutcome]:
    """The drain's processes that still exist, by PID and start time (reads ``/proc``).

    Only those the drain left ``survived`` (or ``running``) are looked for: one it saw end
    has ended, whatever process holds its PID now."""
    return [o for o in drain.outcomes.values()
            if o.fate in (Fate.SURVIVED, Fate.RUNNING) and is_running(o.pid, o.start_time)]
