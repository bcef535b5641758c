"""Which processes belong to a tree: step 2b of the kill, the discovery half of ``ProcessTable``.

A process belongs to a root's tree when

- its parent is a tracked, still-verified process of the tree (ancestry: one ``/proc`` scan per
  enumeration gives the parent map);
- its parent is not tracked (it was reparented away, to PID 1 or a subreaper) and it is in a
  session a tracked process leads: a session is only ever created by ``setsid``, so every
  member descends from its leader, and a leader's PID is not reused while the session
  exists; or it was born during the kill into the process group of a tracked process;
- it sits in the root's unit (``membership``): the root's own cgroup or mount namespace, when
  they are not the coordinator's. This finds what daemonized (double fork and ``setsid``:
  a new session and group, parent gone). Never a root's ancestor (a container's init), nor a
  client of the coordinator (the preStop hook waiting for the drain) or its parents.

A root whose ``Target.reach_uid`` is set (registered without the token by a non-root UID)
takes only processes that UID could signal itself (``kill(2)``: their real or saved UID is
its own), whichever rule found them; each one left alone is named in the report's notes.

Groups and sessions shared with the coordinator itself are never used. What is found outside
ancestry joins as a non-root of its tree, one level below the tree's deepest process (so it
is ended before the processes it may serve, and before the root), with a ``detail`` that
says how it was found. Every admission checks identity (start ticks from the scan).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING

from coordinator.kill import membership, procfs
from coordinator.kill.policy import Target
from coordinator.kill.report import ProcessOutcome
from coordinator.kill.tiers import Member

if TYPE_CHECKING:
    from coordinator.kill.table import Tracked

log = logging.getLogger(__name__)


class TreeDiscovery:
    """Discovery for ``ProcessTable`` (its base class): finds and admits tree members."""

    targets: dict[int, Target]
    protected: frozenset[int]
    live: dict[int, Tracked]
    notes: list[str]
    spared: dict[int, int]
    _own_pgid: int
    _started_boot_s: float

    def _admit(
        self,
        pid: int,
        member: Member,
        *,
        boot: float,
        expected_start: float | None = None,
        expected_ticks: int | None = None,
    ) -> Tracked | None:
        raise NotImplementedError  # ProcessTable's: open a pidfd, then verify identity

    def publish(self, outcome: ProcessOutcome) -> None:
        raise NotImplementedError  # ProcessTable's

    def discover(self) -> list[int]:
        """Step 2b: one pass over ``/proc``; track every new process of the trees.

        A process belongs to a tree when its parent is a tracked, still-verified process of
        that tree; when its parent is not tracked (it was reparented away) and it is in a
        session a tracked process leads, or was born during the kill into the process group
        of a tracked process; or when it is in a root's unit (``membership``: the root's own
        cgroup or mount namespace, never the coordinator's). Returns the PIDs newly tracked.
        """
        parents = [
            t
            for t in self.live.values()
            if not t.exited and self.targets.get(t.member.root_pid, Target(0)).include_tree
        ]
        if not parents and not self._groups() and not self._units.roots:
            return []  # nothing can have descendants to find: spare the /proc scan
        snap = procfs.snapshot()
        boot = procfs.boot_time()
        kids = procfs.children_by_parent(snap.values())
        new: list[int] = []
        frontier = [
            t
            for t in parents
            if (s := snap.get(t.member.pid)) is not None and s.start_ticks == t.start_ticks
        ]
        while True:
            while frontier:
                parent = frontier.pop()
                for child in kids.get(parent.member.pid, ()):
                    admitted = self._admit_child(child, snap, parent, boot)
                    if admitted is not None:
                        new.append(child)
                        frontier.append(admitted)
            frontier = self._orphans_of_groups(snap, boot) or self._unit_members(snap, boot)
            if not frontier:
                return new
            new += [t.member.pid for t in frontier]

    def _groups(self) -> dict[int, Tracked]:
        """Process groups of tracked processes (not ours), each with its deepest member."""
        groups: dict[int, Tracked] = {}
        for t in self.live.values():
            if t.pgid in (0, 1, self._own_pgid):
                continue
            if t.pgid not in groups or t.member.depth > groups[t.pgid].member.depth:
                groups[t.pgid] = t
        return groups

    @cached_property
    def _beyond_reach(self) -> set[tuple[int, int]]:
        """``(pid, start_ticks)`` of processes found under a root whose reach they are
        beyond: left alone, and not looked at again."""
        return set()

    def _within_reach(self, stat: procfs.ProcStat, root_pid: int) -> bool:
        """Whether the root's reach (``Target.reach_uid``) takes ``stat``'s process; one
        that it does not is noted once."""
        target = self.targets.get(root_pid)
        if target is None or target.reach_uid is None:
            return True
        key = (stat.pid, stat.start_ticks)
        if key in self._beyond_reach:
            return False
        uids = procfs.uids(stat.pid, stat.start_ticks)
        if uids is not None and target.reach_uid in uids:
            return True
        self._beyond_reach.add(key)
        self._units.excluded.add(key)
        if uids is not None:
            self.notes.append(
                f"pid {stat.pid} ({stat.name}, UID {uids[0]}) was found under pid {root_pid} "
                f"and left alone: UID {target.reach_uid} registered that worker without the "
                "token and could not signal it")
        return False

    def _admit_child(
        self, pid: int, snap: Mapping[int, procfs.ProcStat], parent: Tracked, boot: float
    ) -> Tracked | None:
        if pid in self.live or pid in self.protected:
            return None
        seen = snap[pid]
        if not self._within_reach(seen, parent.member.root_pid):
            return None
        member = Member(
            pid, parent.member.pid, parent.member.depth + 1, seen.name, "", None,
            parent.member.root_pid,
        )
        return self._admit(pid, member, expected_ticks=seen.start_ticks, boot=boot)

    def _orphans_of_groups(
        self, snap: Mapping[int, procfs.ProcStat], boot: float
    ) -> list[Tracked]:
        """Reparented processes of a session a tracked process leads (every member of a
        session descends from its leader), or born during the kill into a tracked group."""
        groups = self._groups()
        # Compared in the kernel's own clock: start ticks count from boot (CLOCK_BOOTTIME),
        # while the epoch start time is off by the fraction of a second btime drops.
        cutoff = self._started_boot_s - 1.0 / procfs.CLOCK_TICKS
        own_sid = os.getsid(0)
        found: list[Tracked] = []
        for stat in snap.values():
            if stat.pid in self.live or stat.pid in self.protected:
                continue
            parent = self.live.get(stat.ppid)
            if parent is not None and not parent.exited:
                continue  # found through its parent instead
            leader = self._session_leader(stat.sid, snap) if stat.sid != own_sid else None
            deepest = groups.get(stat.pgid)
            if leader is not None:
                depth, root_pid = self._deepest(leader.member.root_pid) + 1, leader.member.root_pid
                why = f"reparented away from its tree; in the session its process {stat.sid} leads"
            elif deepest is not None and stat.start_ticks / procfs.CLOCK_TICKS >= cutoff:
                depth, root_pid = deepest.member.depth + 1, deepest.member.root_pid
                why = "born during the kill, reparented away from its tree"
            else:
                continue
            if not self._within_reach(stat, root_pid):
                continue
            member = Member(stat.pid, stat.ppid, depth, stat.name, "", None, root_pid)
            admitted = self._admit(stat.pid, member, expected_ticks=stat.start_ticks, boot=boot)
            if admitted is not None:
                self._found_as(admitted, why)
                found.append(admitted)
        return found

    def _session_leader(
        self, sid: int, snap: Mapping[int, procfs.ProcStat]
    ) -> Tracked | None:
        """The tracked process that created session ``sid``: still running as itself, or
        gone with its PID unused (a session keeps its ID from being reused)."""
        leader = self.live.get(sid)
        if leader is None or sid in self.protected:
            return None
        now = snap.get(sid)
        if now is not None and now.start_ticks != leader.start_ticks:
            return None  # the PID belongs to another process now
        return leader

    def _deepest(self, root_pid: int) -> int:
        """The depth of the deepest tracked process of ``root_pid``'s tree."""
        return max((t.member.depth for t in self.live.values()
                    if t.member.root_pid == root_pid), default=0)

    def _found_as(self, admitted: Tracked, why: str) -> None:
        """Record how a process outside its tree's ancestry was found."""
        out = admitted.outcome
        out.detail = f"{why}; {out.detail}" if out.detail else why
        self.publish(out)

    def unwatched_roots(self) -> list[int]:
        """The roots whose unit was looked at and found unusable (no cgroup or mount
        namespace of their own): a process that daemonized out of their trees could not be
        found. Empty when no unit was looked at."""
        units = self.__dict__.get("_units")
        if units is None:
            return []
        return sorted(pid for pid in units.seen if pid not in units.roots)

    @cached_property
    def _units(self) -> membership.Units:
        """The roots' units (cgroup, mount namespace) and what is never adopted through them."""
        return membership.Units()

    def _unit_members(
        self, snap: Mapping[int, procfs.ProcStat], boot: float
    ) -> list[Tracked]:
        """Processes in a root's unit that ancestry, groups and sessions did not find (they
        daemonized, or were reparented away): non-roots of that tree, deepest first."""
        units = self._units
        try:
            for t in list(self.live.values()):
                target = self.targets.get(t.member.pid)
                now = snap.get(t.member.pid)
                if (target is not None and target.include_tree and not t.exited
                        and now is not None and now.start_ticks == t.start_ticks):
                    units.add_root(t.member.pid, snap)
            # A target's PID that failed its identity check belongs to another process now.
            adopt, spared = units.search(
                snap, skip=self.live.keys() | self.targets | self.protected)
        except Exception as exc:
            # Membership only ever adds processes: without it, the other rules still hold.
            log.exception("unit membership failed")
            note = f"unit membership failed ({type(exc).__name__}: {exc}): not used"
            if note not in self.notes:
                self.notes.append(note)
            return []
        for f in spared:
            self.spared[f.stat.pid] = f.stat.start_ticks
            self.notes.append(
                f"pid {f.stat.pid} ({f.stat.name}) in the engine's {f.where} was left alone: "
                "it waits on the coordinator (a client of its listening socket, e.g. the "
                "preStop hook) or is the parent of one")
        found: list[Tracked] = []
        for f in adopt:
            root_pid = self.live[f.root_pid].member.root_pid
            if not (self._within_reach(f.stat, f.root_pid)
                    and self._within_reach(f.stat, root_pid)):
                continue
            member = Member(f.stat.pid, f.stat.ppid, self._deepest(root_pid) + 1, f.stat.name,
                            "", None, root_pid)
            admitted = self._admit(f.stat.pid, member, expected_ticks=f.stat.start_ticks,
                                   boot=boot)
            if admitted is not None:
                self._found_as(admitted, f.detail)
                found.append(admitted)
        return found

