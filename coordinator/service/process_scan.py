"""The process scan: every registered and adopted tree as ``/status`` lists it while no kill
runs, and what each tree left behind.

``ProcessScan`` re-discovers the adopted roots and re-lists the trees (in a thread: reading
``/proc`` blocks) at start-up, after each registration, the moment a registered worker exits
(``root_exited`` and ``rescan_soon``) and every ``--scan-interval`` seconds, and keeps the last
listing: ``/status`` shows it, and the drain's kill takes from it (``kill_remnants``) what
exited workers left behind and what left a tree.

Beside each root's descendants, a listing keeps the processes that left their tree (their
parent exited, or they daemonized), each with a ``detail`` saying how it was found:

- listed under a root before, still running as itself, though no longer its descendant;
- in the session or process group a root leads: both carry the root's PID as their ID, and
  the kernel does not reuse a PID while a session or group holds it, so their members were
  started under that root, even once it exited (a crashed worker's late children);
- in a root's unit (its cgroup or mount namespace, ``coordinator/kill/membership.py``), as
  last seen while the root ran; never the coordinator's own clients (the preStop hook).

Under a root registered without the token by a non-root UID (``reach``), only processes that
UID could signal are listed, whichever rule found them: what the kill would never take
(``Target.reach_uid``) is not shown as the worker's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.kill import adoption, identity, membership, procfs, safety
from coordinator.kill.report import Fate, ProcessOutcome

log = logging.getLogger(__name__)

Roots = list[tuple[int, str]]
"""(PID, role) of each registered worker's root."""

LEFT_TREE = "left its tree (its parent exited)"


CMDLINE_SHOWN = 160
"""Characters of a command line ``/status`` shows (enough to tell the processes apart)."""


def process_entry(o: ProcessOutcome) -> dict[str, Any]:
    """A process as ``/status`` lists it (its command line cut to ``CMDLINE_SHOWN``)."""
    cmdline = o.cmdline if len(o.cmdline) <= CMDLINE_SHOWN else o.cmdline[:CMDLINE_SHOWN] + "…"
    return {"pid": o.pid, "name": o.name, "cmdline": cmdline, "role": o.role,
            "root_pid": o.root_pid,
            "parent_pid": o.parent_pid, "depth": o.depth, "fate": o.fate.value,
            "exit_code": o.exit_code, "signal": o.signal, "tier": o.tier,
            "elapsed_ms": o.elapsed_ms, "detail": o.detail,
            "signalled_at": o.signalled_at, "kill_at": o.kill_at, "killed_at": o.killed_at,
            "ended_at": o.ended_at}


def within_reach(uid: int, pid: int, start_ticks: int) -> bool:
    """Whether ``uid`` could signal the process ``pid`` (started at ``start_ticks``):
    ``kill(2)``'s rule, its real or saved UID. A process gone (or reused) is not."""
    uids = procfs.uids(pid, start_ticks)
    return uids is not None and uid in uids


@dataclass(frozen=True)
class RootFacts:
    """What a root's unit was while it ran: enough to find its leftovers once it exited."""

    unit: membership.Unit
    ancestors: frozenset[tuple[int, int]]
    """Never leftovers: its parents (a container's init or wrapper shell)."""
    sid: int


@dataclass
class Listing:
    """One scan's result."""

    snap: dict[int, procfs.ProcStat]
    processes: dict[int, ProcessOutcome] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)
    """Processes that left a live root's tree and only an earlier listing knows (not its
    session, group or unit, which the kill looks through itself), with their descendants."""
    facts: dict[int, RootFacts] = field(default_factory=dict)
    unwatched: list[int] = field(default_factory=list)
    """Live roots with no cgroup or mount namespace of their own (``membership.UNWATCHED``)."""


def list_processes(live: Roots, previous: Mapping[int, ProcessOutcome],
                   exited: Mapping[int, float], facts: Mapping[int, RootFacts],
                   reach: Mapping[int, int] | None = None, *, cmdlines: bool = True) -> Listing:
    """The live roots' trees and every root's leftovers (``exited``: registered roots that
    exited, PID to start time), from one ``/proc`` snapshot; under a root of ``reach`` (root
    PID → UID) only processes that UID could signal. ``cmdlines=False`` leaves each
    process's command line out (a read per process, which the kill's own listing does not
    need)."""
    listing = Listing(procfs.snapshot())
    snap, boot = listing.snap, procfs.boot_time()
    kids = procfs.children_by_parent(snap.values())

    def add(pid: int, root: int, depth: int, role: str | None, detail: str, left: bool,
            ended: bool = False) -> None:
        stat = snap[pid]
        if pid in listing.processes or (stat.zombie and not ended):
            return
        if reach and root in reach and pid != root and not within_reach(
                reach[root], pid, stat.start_ticks):
            return
        listing.processes[pid] = ProcessOutcome(
            pid=pid, name=stat.name, start_time=stat.start_time(boot),
            cmdline=procfs.cmdline(pid) if cmdlines else "", root_pid=root,
            parent_pid=stat.ppid, depth=depth,
            role=role, detail=detail)
        if stat.zombie and stat.exit_status is not None:
            # A zombie holds its PID, so the exit status /proc shows is this process's.
            listing.processes[pid].fate = Fate.GONE
            listing.processes[pid].exit_code = os.waitstatus_to_exitcode(stat.exit_status)
        if left:
            listing.left.add(pid)

    def add_tree(pid: int, root: int, depth: int, role: str | None, detail: str,
                 left: bool = False, ended: bool = False) -> None:
        add(pid, root, depth, role, detail, left, ended)
        for child, below in procfs.descendants(pid, snap, kids):
            add(child, root, depth + below, None, LEFT_TREE if detail else "", left)

    units = membership.Units()
    live_pids = {pid for pid, _ in live if pid in snap}
    for pid, role in live:
        if pid in live_pids:
            add_tree(pid, pid, 0, role, "")
            units.add_root(pid, snap)
            if pid in units.roots:
                listing.facts[pid] = RootFacts(units.roots[pid],
                                               frozenset(membership.ancestors(pid, snap)),
                                               snap[pid].sid)
    listing.unwatched = sorted(pid for pid in live_pids if pid not in units.roots)
    gone = {pid for pid in exited if pid not in live_pids}
    for pid in gone & facts.keys():
        f = listing.facts[pid] = facts[pid]
        units.record(pid, f.unit, set(f.ancestors), f.sid)
    roots = live_pids | gone
    protected = safety.protected_pids()
    # A session or group ID that is a root's PID: the root's, unless that PID is reused (an
    # exited root may still be there as a zombie its parent has not reaped).
    leaders = live_pids | {pid for pid in gone if pid not in snap or identity.same_start(
        snap[pid].start_time(boot), exited[pid])}
    for stat in snap.values():
        if stat.pid in listing.processes or stat.pid in protected:
            continue
        for leader, what in ((stat.sid, "session"), (stat.pgid, "process group")):
            if leader in leaders and leader != stat.pid:
                if stat.zombie and leader not in gone:
                    break  # a live root's child that just exited: its parent reaps it
                verb = "led (its worker exited)" if leader in gone else "leads"
                # An exited worker's child that died with it and was never listed (started
                # after the last scan) is listed as ended while it is a zombie: the drain's
                # summary must name it with how it ended.
                add_tree(stat.pid, leader, 1, None, f"left its tree; in the {what} its root "
                         f"{leader} {verb}" + (" (ended, not yet reaped)" if stat.zombie
                                               else ""), ended=stat.zombie)
                break
    adopt, _ = units.search(snap, skip=listing.processes.keys() | protected | roots)
    for found in adopt:
        add_tree(found.stat.pid, found.root_pid, 1, None, found.detail)
    # Last: what only an earlier listing knows (found by none of the rules above).
    for o in previous.values():
        seen = snap.get(o.pid)
        if (o.root_pid in roots and seen is not None and o.start_time is not None
                and procfs.same_start(seen.start_time(boot), o.start_time)):
            add_tree(o.pid, o.root_pid, max(o.depth, 1), o.role, o.detail or LEFT_TREE,
                     left=o.root_pid in live_pids)
    return listing


class ProcessScan:
    """The adopted roots and every process of the registered and adopted trees, as last
    listed; single event loop, no locks (scans take turns)."""

    def __init__(self, rules: adoption.AdoptionRules, on_change: Callable[[], None]) -> None:
        self.rules = rules
        self.adopted: list[identity.ProcessFacts] = []
        self.scanned: dict[int, ProcessOutcome] = {}
        self.exited: dict[int, float] = {}
        """Registered roots that exited (PID to start time), until deregistered."""
        self.left_behind: dict[int, ProcessOutcome] = {}
        """What was last listed under each exited root when it exited (by PID): a later scan
        no longer lists the ones that died with it, yet the drain must report them."""
        self._facts: dict[int, RootFacts] = {}
        self.unwatched: list[int] = []
        """Live roots whose escapes cannot be watched for, as last listed."""
        self.reach: dict[int, int] = {}
        """Roots registered without the token by a non-root UID, PID → that UID: their
        listings hold only what it could signal."""
        self._on_change = on_change
        """Called when the set of adopted roots or of listed processes changed."""
        self._task: asyncio.Task[None] | None = None
        self._soon: set[asyncio.Task[None]] = set()
        self._turn = asyncio.Lock()

    async def rescan(self, roots: Roots) -> None:
        """Re-discover adopted roots and re-list every registered and adopted tree."""
        async with self._turn:
            registered = [pid for pid, _ in roots]
            adopted, listing = await asyncio.to_thread(
                self._scan, roots, registered, dict(self.scanned), dict(self.exited),
                dict(self._facts))
            changed = ({f.pid for f in adopted} != {f.pid for f in self.adopted}
                       or listing.processes.keys() != self.scanned.keys()
                       or listing.unwatched != self.unwatched)
            # A root whose worker has not been seen to exit yet may be dead already (its
            # exit is noticed on the loop, this scan ran in a thread): what was listed under
            # it is remembered as root_exited would, or it would be listed nowhere.
            dead = {pid for pid in registered
                    if pid not in listing.snap or listing.snap[pid].zombie}
            self.left_behind.update((o.pid, o) for o in self.scanned.values()
                                    if o.root_pid in dead and o.depth > 0
                                    and o.pid not in self.left_behind)
            self.adopted = adopted
            self.scanned = listing.processes
            self._facts = listing.facts
            self.unwatched = listing.unwatched
            if changed:
                self._on_change()

    def _scan(self, roots: Roots, registered: list[int], previous: dict[int, ProcessOutcome],
              exited: dict[int, float], facts: dict[int, RootFacts],
              ) -> tuple[list[identity.ProcessFacts], Listing]:
        adopted = adoption.discover(self.rules, exclude=registered)
        live = [*roots, *((f.pid, "adopted") for f in adopted)]
        return adopted, list_processes(live, previous, exited, facts, dict(self.reach))

    def root_exited(self, pid: int, start_time: float) -> None:
        """A registered root exited: its leftovers are looked for from now on, and what was
        listed under it is remembered (the kill reports those that are gone ``gone``)."""
        if pid not in self.exited:
            self.left_behind.update((o.pid, o) for o in self.scanned.values()
                                    if o.root_pid == pid and o.depth > 0)
        self.exited[pid] = start_time

    def rescan_soon(self, roots: Roots) -> None:
        """Rescan now, in the background (after the scan under way, if any)."""
        task = asyncio.get_running_loop().create_task(self._rescan_logged(roots))
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    def kill_remnants(self, live: Roots) -> list[ProcessOutcome]:
        """What the kill takes besides the live roots (``live``), looked for again now:
        everything listed under exited roots (the kill reports the gone ones gone) and every
        process that left a tree. Never a client of the coordinator, nor a parent of one."""
        live_pids = {pid for pid, _ in live}
        exited = {pid: start for pid, start in self.exited.items() if pid not in live_pids}
        listing = list_processes(live, self.scanned, exited, self._facts, self.reach,
                                 cmdlines=False)
        out = {o.pid: o for o in self.left_behind.values() if o.root_pid in exited}
        out.update((o.pid, o) for o in self.scanned.values()
                   if o.root_pid in exited and o.depth > 0)
        out.update((o.pid, o) for o in listing.processes.values()
                   if o.root_pid in exited or o.pid in listing.left)
        alive = {pid for pid in out if pid in listing.snap}
        spared = membership.clients_and_parents(alive, listing.snap)
        for pid in sorted(spared):
            log.info("not killing pid %d: it waits on the coordinator (or runs what does)", pid)
        return [o for pid, o in out.items() if pid not in spared and pid not in live_pids]

    def forget_root(self, root_pid: int) -> None:
        """Drop the processes listed under ``root_pid`` (its worker deregistered)."""
        self.scanned = {p: o for p, o in self.scanned.items() if o.root_pid != root_pid}
        self.exited.pop(root_pid, None)
        self._facts.pop(root_pid, None)
        self.reach.pop(root_pid, None)
        self.left_behind = {p: o for p, o in self.left_behind.items() if o.root_pid != root_pid}

    def start(self, interval_s: float, roots: Callable[[], Roots],
              paused: Callable[[], bool]) -> None:
        """Rescan every ``interval_s`` seconds, except while ``paused()`` (a kill runs)."""
        self._task = asyncio.get_running_loop().create_task(
            self._scan_forever(interval_s, roots, paused))

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._soon) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _rescan_logged(self, roots: Roots) -> None:
        try:
            await self.rescan(roots)
        except Exception:
            log.exception("process scan failed")

    async def _scan_forever(self, interval_s: float, roots: Callable[[], Roots],
                            paused: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if paused():
                continue
            await self._rescan_logged(roots())
