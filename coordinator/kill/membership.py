"""An engine's unit: its root's cgroup and mount namespace, the way systemd tracks a service.

Ancestry loses a process that daemonizes (double fork and ``setsid``): its parent exits, it
is reparented to PID 1 or a subreaper, and it leads a new session and group. It keeps the
cgroup and the mount namespace it was born in, though, and inside a container both are the
container's own. So a process is also one of a root's when it sits in the root's cgroup (or
below it) or shares the root's mount namespace.

A unit key is only used when it tells the engine apart from the coordinator, PID 1 and the
coordinator's ancestors: a cgroup that holds one of them too (a plain host, where everything
sits in one cgroup) or a mount namespace shared with one of them (the host's) says nothing
about who started a process. Then membership adds nothing (``unit_of`` returns None) and only
ancestry, groups and sessions count.

Cgroups: the v2 path (the ``0::`` line of ``/proc/<pid>/cgroup``), else the v1 ``name=systemd``
hierarchy, else the v1 ``pids`` one: the first of them where the root's cgroup does not
hold the coordinator's. Paths are compared as the reader's cgroup namespace shows them.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Mapping, Set
from dataclasses import dataclass, field

from coordinator.kill import callers, procfs

V2 = ""
"""Key of the cgroup v2 hierarchy (the ``0::`` line) in ``Placement.cgroups``."""
HIERARCHIES = (V2, "name=systemd", "pids")
"""Hierarchies a unit may be told by, in order of preference."""


UNWATCHED = ("no cgroup or mount namespace of its own (a plain host): a process that leaves its "
             "tree by setsid once its parent exited (a daemon) cannot be found, and is neither "
             "listed nor stopped. Give the engine a unit of its own: its own systemd service "
             "(KillMode=control-group), or a container")


def escapes(unwatched: list[int]) -> dict[str, object] | None:
    """What ``/status`` and a drain's summary say of roots whose escapes could not be
    watched for; None when there are none."""
    if not unwatched:
        return None
    shown = ", ".join(str(pid) for pid in unwatched[:20])
    more = f" and {len(unwatched) - 20} more" if len(unwatched) > 20 else ""
    return {"watched": False, "unwatched_roots": list(unwatched),
            "detail": f"pid {shown}{more}: {UNWATCHED}"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a process sits: its cgroup in each hierarchy, its mount namespace."""

    cgroups: Mapping[str, str]
    """Hierarchy (``""`` for v2, ``name=systemd``, a v1 controller) to cgroup path."""
    mnt: str | None
    """``/proc/<pid>/ns/mnt``'s link (``mnt:[4026531841]``); None when it cannot be read."""


@dataclass(frozen=True, slots=True)
class Unit:
    """The usable keys of a root's unit (at least one is set)."""

    hierarchy: str | None = None
    cgroup: str | None = None
    mnt: str | None = None

    def holds(self, placement: Placement) -> str | None:
        """Where ``placement`` matches this unit (``cgroup /x``), or None when it does not."""
        if self.hierarchy is not None and self.cgroup is not None:
            path = placement.cgroups.get(self.hierarchy)
            if path is not None and within(path, self.cgroup):
                shown = self.cgroup if self.hierarchy == V2 else f"{self.hierarchy}:{self.cgroup}"
                return f"cgroup {shown}"
        if self.mnt is not None and placement.mnt == self.mnt:
            return f"mount namespace {self.mnt}"
        return None


def parse_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as ``{hierarchy: path}``.

    Lines are ``ID:CONTROLLERS:PATH``; v2 has ID 0 and no controllers (key ``""``), a v1
    line lists its controllers (``2:cpu,cpuacct:/x``: one key each) or a name
    (``1:name=systemd:/x``). The path may itself contain colons.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ident, controllers, path = parts
        if ident == "0" and not controllers:
            out[V2] = path
            continue
        for controller in controllers.split(","):
            if controller:
                out[controller] = path
    return out


def within(path: str, top: str) -> bool:
    """Whether cgroup ``path`` is ``top`` or below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def unit_of(root: Placement, own: Placement | None,
            others: Iterable[Placement] = ()) -> Unit | None:
    """The keys of ``root``'s unit that hold neither the coordinator (``own``) nor any of
    ``others`` (PID 1 and the coordinator's ancestors, as far as they can be read: a unit PID 1
    is in is the whole host's); None when none is usable (a plain host, or ``own`` unknown)."""
    if own is None:
        return None
    others = list(others)
    hierarchy = cgroup = None
    for name in HIERARCHIES:
        theirs, ours = root.cgroups.get(name), own.cgroups.get(name)
        if theirs is None or ours is None or within(ours, theirs):
            continue
        if any(within(o.cgroups[name], theirs) for o in others if name in o.cgroups):
            continue
        hierarchy, cgroup = name, theirs
        break
    mnt = root.mnt
    if mnt is not None and (own.mnt is None or mnt == own.mnt
                            or any(o.mnt == mnt for o in others)):
        mnt = None
    if cgroup is None and mnt is None:
        return None
    return Unit(hierarchy, cgroup, mnt)


def bystanders() -> list[Placement]:
    """The placements of PID 1 and of the coordinator's ancestors that can be read."""
    found = (read(pid) for pid in dict.fromkeys([1, *procfs.ancestors()]))
    return [p for p in found if p is not None]


def read(pid: int, start_ticks: int | None = None) -> Placement | None:
    """A process's placement from ``/proc``; None when it is gone, or (given ``start_ticks``)
    when the PID no longer belongs to the process that started then."""
    try:
        with open(f"{procfs.PROC}/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    try:
        mnt: str | None = os.readlink(f"{procfs.PROC}/{pid}/ns/mnt")
    except OSError:
        mnt = None  # gone, a zombie, or no ptrace access to it
    if start_ticks is not None:
        # Read after the files: the same start ticks mean they were that process's.
        stat = procfs.read_stat(pid)
        if stat is None or stat.start_ticks != start_ticks:
            return None
    return Placement(parse_cgroup(text), mnt)


@dataclass(frozen=True, slots=True)
class Found:
    """A process of a unit that ancestry did not find."""

    stat: procfs.ProcStat
    root_pid: int
    """The root whose unit holds it."""
    where: str
    """``cgroup /x`` or ``mount namespace mnt:[...]``."""
    daemonized: bool
    """It left its root's session (``setsid``), not just its parent."""

    @property
    def detail(self) -> str:
        how = "daemonized" if self.daemonized else "reparented"
        return f"left its tree ({how}); found in the engine's {self.where}"


@dataclass
class Units:
    """The roots' units, and the processes of them that are never adopted: the roots'
    ancestors (a container's init or wrapper shell) and the coordinator's own clients (the
    preStop hook waiting for this drain, ``shutdown-coordinator drain`` run in the engine's
    container), with the ancestors of those clients."""

    own: Placement | None = field(default_factory=lambda: read(os.getpid()))
    others: list[Placement] = field(default_factory=bystanders)
    roots: dict[int, Unit] = field(default_factory=dict)
    sessions: dict[int, int] = field(default_factory=dict)
    """Each root's session, as first seen."""
    seen: set[int] = field(default_factory=set)
    """Roots already looked at (with or without a usable unit)."""
    excluded: set[tuple[int, int]] = field(default_factory=set)
    """``(pid, start_ticks)`` never adopted through a unit."""

    def add_root(self, pid: int, snap: Mapping[int, procfs.ProcStat]) -> None:
        """Read a live root's unit once (its identity is the snapshot's start ticks)."""
        if pid in self.seen or pid not in snap:
            return
        self.seen.add(pid)
        placement = read(pid, snap[pid].start_ticks)
        unit = None if placement is None else unit_of(placement, self.own, self.others)
        if unit is not None:
            self.record(pid, unit, ancestors(pid, snap), snap[pid].sid)

    def record(self, pid: int, unit: Unit, excluded: set[tuple[int, int]], sid: int) -> None:
        """Take a root's unit, the processes never adopted through it (its ancestors) and
        its session as known."""
        self.seen.add(pid)
        self.roots.setdefault(pid, unit)
        self.sessions.setdefault(pid, sid)
        self.excluded |= excluded

    def search(
        self, snap: Mapping[int, procfs.ProcStat], skip: Container[int]
    ) -> tuple[list[Found], list[Found]]:
        """The snapshot's processes in a root's unit that are not in ``skip``: (to adopt,
        newly spared clients of the coordinator). Never PID 1, kernel threads or zombies."""
        if not self.roots:
            return [], []
        found: list[Found] = []
        for stat in snap.values():
            if stat.pid <= 2 or stat.ppid == 2 or stat.zombie or stat.pid in skip:
                continue
            if (stat.pid, stat.start_ticks) in self.excluded:
                continue
            placement = read(stat.pid, stat.start_ticks)
            if placement is None:
                continue
            for root_pid, unit in self.roots.items():
                where = unit.holds(placement)
                if where is not None:
                    daemonized = stat.sid != self.sessions.get(root_pid)
                    found.append(Found(stat, root_pid, where, daemonized))
                    break
        if not found:
            return [], []
        spared_pids = clients_and_parents({f.stat.pid for f in found}, snap)
        spared = [f for f in found if f.stat.pid in spared_pids]
        self.excluded |= {(f.stat.pid, f.stat.start_ticks) for f in spared}
        return [f for f in found if f.stat.pid not in spared_pids], spared


def clients_and_parents(pids: Set[int], snap: Mapping[int, procfs.ProcStat]) -> set[int]:
    """Those of ``pids`` that are clients of ours (``callers``), with their ancestors among
    ``pids`` (a shell that runs the hook without ``exec``)."""
    spared: set[int] = set()
    for pid in callers.clients(pids):
        while pid in pids and pid not in spared:
            spared.add(pid)
            pid = snap[pid].ppid if pid in snap else 0
    return spared


def ancestors(pid: int, snap: Mapping[int, procfs.ProcStat]) -> set[tuple[int, int]]:
    """``(pid, start_ticks)`` of ``pid``'s ancestors in the snapshot (PID 1 excluded)."""
    out: set[tuple[int, int]] = set()
    current = snap[pid].ppid
    while current > 1 and current in snap and (current, snap[current].start_ticks) not in out:
        out.add((current, snap[current].start_ticks))
        current = snap[current].ppid
    return out
