"""What the kill engine tells about each process: its fate, and the whole run's report.

These types are shared by the kill engine, the drain controller and the HTTP ``/status``
document, so their field names are part of the contract (see docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any


class Fate(enum.StrEnum):
    """How a process ended (or has not yet)."""

    RUNNING = "running"
    """Known and alive; the kill has not reached it yet or is waiting for it."""
    EXITED = "exited"
    """Ended after the graceful signal (or on its own while the kill ran)."""
    KILLED = "killed"
    """Needed SIGKILL: it outlived its tier's timeout, or the kill was in force mode."""
    GONE = "gone"
    """Already gone before it was signalled (or its PID now belongs to another process)."""
    SURVIVED = "survived"
    """Still there at the deadline, even after SIGKILL (uninterruptible sleep, another PID ns)."""

    @property
    def final(self) -> bool:
        return self is not Fate.RUNNING

    @property
    def graceful(self) -> bool:
        return self in (Fate.EXITED, Fate.GONE)


@dataclass
class ProcessOutcome:
    """One process's record through a kill. Times are UNIX epoch seconds."""

    pid: int
    name: str
    start_time: float | None = None
    """Process start time (epoch s) — the identity that guards against PID reuse."""
    cmdline: str = ""
    root_pid: int | None = None
    """The registered/adopted root this process was found under."""
    parent_pid: int | None = None
    depth: int = 0
    """0 for a root, 1 for its children, and so on."""
    role: str | None = None
    tier: str | None = None
    """Name of the tier that terminated it."""
    fate: Fate = Fate.RUNNING
    signal: str | None = None
    """The graceful signal sent (e.g. ``SIGTERM``), or None if none was sent."""
    signalled_at: float | None = None
    kill_at: float | None = None
    """When its tier's wait ends and SIGKILL follows if it still runs: the graceful signal plus
    the wait the kill allotted the tier (its timeout, cut to the deadline and to what the later
    tiers keep). Set with the graceful signal; None when none was sent."""
    killed_at: float | None = None
    """When SIGKILL was sent, if it was."""
    ended_at: float | None = None
    elapsed_ms: float | None = None
    """From the first signal to the observed exit."""
    exit_code: int | None = None
    """subprocess convention: >= 0 exit status, < 0 killed by that signal; None when unknown."""
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        # What ``dataclasses.asdict`` gives, without its deep copy of every value (they are
        # all immutable): state files and summaries hold hundreds of these.
        data = {name: getattr(self, name) for name in _OUTCOME_FIELDS}
        data["fate"] = self.fate.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessOutcome:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        values["fate"] = Fate(values.get("fate", Fate.RUNNING.value))
        return cls(**values)


_OUTCOME_FIELDS = tuple(f.name for f in fields(ProcessOutcome))


@dataclass
class KillReport:
    """The result of one ordered kill."""

    started_at: float
    ended_at: float | None = None
    mode: str = "graceful"
    """``graceful`` (tiers of the configured signal, then SIGKILL) or ``force`` (SIGKILL only)."""
    exit_detection: str = "pidfd"
    """``pidfd`` (event-driven) or ``poll`` (fallback where pidfds are unavailable)."""
    exit_codes_from: str = "waitid+pidfd_info"
    """Where exit codes come from: ``waitid+pidfd_info``, ``waitid`` or ``unavailable``."""
    processes: list[ProcessOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unwatched_roots: list[int] = field(default_factory=list)
    """Roots with no cgroup or mount namespace of their own (a plain host): what daemonized
    out of their trees could not be looked for (``coordinator.kill.membership``)."""

    @property
    def graceful(self) -> bool:
        """True when nothing needed SIGKILL and nothing survived."""
        return all(p.fate.graceful for p in self.processes)

    def counts(self) -> dict[str, int]:
        out = {fate.value: 0 for fate in Fate}
        for p in self.processes:
            out[p.fate.value] += 1
        return out

    def to_dict(self, *, processes: bool = True) -> dict[str, Any]:
        """The report as JSON; without its ``processes`` when they are kept elsewhere."""
        data: dict[str, Any] = {
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "mode": self.mode,
            "exit_detection": self.exit_detection,
            "exit_codes_from": self.exit_codes_from,
            "graceful": self.graceful,
            "counts": self.counts(),
        }
        if processes:
            data["processes"] = [p.to_dict() for p in self.processes]
        data["notes"] = list(self.notes)
        data["unwatched_roots"] = list(self.unwatched_roots)
        return data
