"""A ``/status`` document read into what the timeline draws.

``read(document)`` is pure and total: any JSON value gives a ``Timeline`` (missing keys,
wrong types and non-finite numbers are read as unknown), so a damaged or hostile document
draws as far as it can instead of raising. Strings are kept as found; ``text.text`` makes
them safe when they are written.

Which drain is drawn: the document's ``drain`` (the running or just finished one), else its
``last_drain`` (back to serving, a new cycle). The processes are the document's
``processes``: at ``done`` the kill's outcomes. (``GET /status/timeline?drain=last`` hands
the renderer a document whose ``drain`` and ``processes`` are the last drain's.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coordinator.timeline.text import integer, number

MAX_PROCESSES = 20_000
"""Processes read from one document; past this the rest are counted, not read."""
MAX_HANDOFFS = 10_000
"""Pending handoffs and handoff events read (the coordinator's own cap on pending ones)."""
MAX_WORKERS = 1_024
"""Workers read (the coordinator's ``--max-workers`` default)."""
MAX_PHASES = 256
MAX_CAUSES = 50


@dataclass(frozen=True)
class Drain:
    reason: str
    started_at: float | None
    deadline_at: float | None
    migration_deadline_at: float | None
    ended_at: float | None
    outcome: str | None
    causes: tuple[str, ...]
    lost_requests: int | None
    force: bool


@dataclass(frozen=True)
class Band:
    """One phase of the drain, from ``start`` to ``end`` (None: still in it)."""

    phase: str
    start: float
    end: float | None
    note: str


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    cmdline: str
    role: str
    root_pid: int | None
    depth: int | None
    tier: str
    fate: str
    exit_code: int | None
    signal: str
    detail: str
    signalled_at: float | None
    kill_at: float | None
    killed_at: float | None
    ended_at: float | None

    @property
    def look(self) -> str:
        """The colour class: the fate, and ``failed`` for an exit that was not 0."""
        if self.fate == "exited" and self.exit_code not in (None, 0):
            return "failed"
        return self.fate if self.fate in FATES else "unknown"

    def times(self) -> list[float]:
        return [t for t in (self.signalled_at, self.kill_at, self.killed_at, self.ended_at)
                if t is not None]


FATES = ("exited", "killed", "gone", "survived", "running")


@dataclass(frozen=True)
class Worker:
    id: str
    pid: int | None
    role: str
    state: str
    pushed_at: float | None
    """When the drain line was handed to its event stream."""
    notified_at: float | None
    """When it says its ``shutdown_event`` was set."""


@dataclass(frozen=True)
class HandoffMark:
    """A handed-back request (``handed_back``), acknowledgements (``acked``) or expiries
    (``expired``) at a time; ``count`` of them."""

    at: float
    event: str
    count: int
    label: str


@dataclass
class Timeline:
    drain: Drain | None
    which: str
    """``drain`` or ``last_drain``: where the drain drawn was found."""
    phase: str
    bands: list[Band] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    left_out: int = 0
    """Processes of the document not read (past ``MAX_PROCESSES``)."""
    workers: list[Worker] = field(default_factory=list)
    handoffs: list[HandoffMark] = field(default_factory=list)
    migration_counts: dict[str, int] = field(default_factory=dict)

    def times(self) -> list[float]:
        """Every time the drawing shows."""
        found: list[float] = []
        if self.drain is not None:
            found += [t for t in (self.drain.started_at, self.drain.deadline_at,
                                  self.drain.migration_deadline_at, self.drain.ended_at)
                      if t is not None]
        for band in self.bands:
            found += [band.start] + ([band.end] if band.end is not None else [])
        for process in self.processes:
            found += process.times()
        for worker in self.workers:
            found += [t for t in (worker.pushed_at, worker.notified_at) if t is not None]
        found += [h.at for h in self.handoffs]
        return found


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object, most: int) -> list[Any]:
    return value[:most] if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def read(document: object) -> Timeline:
    """The timeline of ``document`` (a ``/status`` document, or anything)."""
    doc = _dict(document)
    which = "drain" if isinstance(doc.get("drain"), dict) else "last_drain"
    drain = _drain(doc.get(which))
    timeline = Timeline(drain=drain, which=which, phase=_str(doc.get("phase")))
    timeline.bands = _bands(_list(doc.get("timeline"), MAX_PHASES), drain)
    entries = doc.get("processes")
    timeline.processes = [_process(p) for p in _list(entries, MAX_PROCESSES)
                          if isinstance(p, dict) and integer(p.get("pid")) is not None]
    if isinstance(entries, list):
        timeline.left_out = max(len(entries) - MAX_PROCESSES, 0)
    timeline.workers = [_worker(w) for w in _list(doc.get("workers"), MAX_WORKERS)
                        if isinstance(w, dict)]
    timeline.handoffs = _handoffs(doc)
    counts = _dict(doc.get("migration_counts"))
    timeline.migration_counts = {str(k)[:32]: v for k, v in list(counts.items())[:16]
                                 if integer(v) is not None}
    return timeline


def _drain(value: object) -> Drain | None:
    if not isinstance(value, dict):
        return None
    causes = tuple(_str(c) for c in _list(value.get("causes"), MAX_CAUSES))
    outcome = value.get("outcome")
    return Drain(reason=_str(value.get("reason")), started_at=number(value.get("started_at")),
                 deadline_at=number(value.get("deadline_at")),
                 migration_deadline_at=number(value.get("migration_deadline_at")),
                 ended_at=number(value.get("ended_at")),
                 outcome=outcome if isinstance(outcome, str) else None, causes=causes,
                 lost_requests=integer(value.get("lost_requests")),
                 force=value.get("force") is True)


def _bands(entries: list[Any], drain: Drain | None) -> list[Band]:
    """The phases of ``drain`` as bands: the timeline's transitions from the drain's start
    to its end (the transition after its end, back to serving, closes the last band)."""
    if drain is None or drain.started_at is None:
        return []
    moves = sorted(((number(e.get("at")), _str(e.get("phase")), _str(e.get("note")))
                    for e in entries if isinstance(e, dict) and number(e.get("at")) is not None),
                   key=lambda m: m[0] or 0.0)
    start = drain.started_at
    # The drain's own transitions: from its start (draining) up to the next cycle's serving.
    ours: list[tuple[float, str, str]] = []
    for at, phase, note in moves:
        assert at is not None
        if at < start - 0.001:
            continue
        if ours and phase == "serving":
            ours.append((at, phase, note))
            break
        ours.append((at, phase, note))
    bands = []
    for index, (at, phase, note) in enumerate(ours):
        if phase == "serving":
            break
        end = ours[index + 1][0] if index + 1 < len(ours) else None
        bands.append(Band(phase, at, end, note))
    return bands


def _process(entry: dict[str, Any]) -> Process:
    pid = integer(entry.get("pid"))
    assert pid is not None
    return Process(
        pid=pid, name=_str(entry.get("name")), cmdline=_str(entry.get("cmdline")),
        role=_str(entry.get("role")), root_pid=integer(entry.get("root_pid")),
        depth=integer(entry.get("depth")), tier=_str(entry.get("tier")),
        fate=_str(entry.get("fate")), exit_code=integer(entry.get("exit_code")),
        signal=_str(entry.get("signal")), detail=_str(entry.get("detail")),
        signalled_at=number(entry.get("signalled_at")), kill_at=number(entry.get("kill_at")),
        killed_at=number(entry.get("killed_at")), ended_at=number(entry.get("ended_at")))


def _worker(entry: dict[str, Any]) -> Worker:
    return Worker(id=_str(entry.get("id")), pid=integer(entry.get("pid")),
                  role=_str(entry.get("role")), state=_str(entry.get("state")),
                  pushed_at=number(entry.get("pushed_at")),
                  notified_at=number(entry.get("notified_at")))


def _handoffs(doc: dict[str, Any]) -> list[HandoffMark]:
    """Pending handoffs (each handed back at its time) and, when the document carries a
    ``handoff_log`` (``GET /status/timeline`` adds it), every handed-back, acknowledged and
    expired event of the drain."""
    marks: list[HandoffMark] = []
    for entry in _list(doc.get("migrations"), MAX_HANDOFFS):
        at = number(_dict(entry).get("handed_back_at"))
        if at is not None:
            marks.append(HandoffMark(at, "pending", 1, _str(entry.get("request_id"))))
    for entry in _list(doc.get("handoff_log"), MAX_HANDOFFS):
        item = _dict(entry)
        at, count, event = number(item.get("at")), integer(item.get("count")), item.get("event")
        if at is not None and count and event in ("handed_back", "acked", "expired"):
            marks.append(HandoffMark(at, str(event), count, ""))
    return marks
