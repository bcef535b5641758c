"""The processes of one kill: how each was found, its pidfd, and its outcome so far.

Discovery always opens the pidfd *before* checking identity: if the start time read after
opening still matches, the pidfd refers to the expected process, and every later signal goes
through that pidfd, so a PID recycled in the meantime is never signalled.

``ProcessTable`` admits processes (step 2a here, 2b in ``discovery``), signals them
(steps 5-6, ``signalling``), and settles each one's fate as it exits and at the end (step 8;
its exit code from ``process_exit``, what a previous run did from ``prior_run``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from coordinator.kill import pidfd, prior_run, procfs
from coordinator.kill.discovery import TreeDiscovery
from coordinator.kill.policy import Target
from coordinator.kill.process_exit import death_detail, exit_code
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.kill.signalling import Signalling
from coordinator.kill.tiers import Member

log = logging.getLogger(__name__)

OnUpdate = Callable[[ProcessOutcome], object]
HandRoots = Callable[[list[int]], "str | None"]
"""Asked when a tier holding roots is next: a detail when the caller of the kill sends their
graceful signal itself (the kill only waits for them), None when the kill is to send it."""
PriorOutcomes = (
    Mapping[tuple[int, float], ProcessOutcome] | Mapping[tuple[int, float | None], ProcessOutcome]
)
"""``{(pid, start_time): outcome}`` from a previous run; matched on the outcomes' own pid and
start time."""


@dataclass
class Tracked:
    """One live process the kill is responsible for."""

    outcome: ProcessOutcome
    member: Member
    start_ticks: int
    pgid: int
    fd: int | None
    exited: bool = False

    @property
    def signalled(self) -> bool:
        return self.outcome.signalled_at is not None or self.outcome.killed_at is not None


class ProcessTable(TreeDiscovery, Signalling):
    """Discovers the targets' trees and keeps every process's outcome up to date."""

    def __init__(
        self,
        targets: Iterable[Target],
        *,
        protected: frozenset[int],
        use_pidfd: bool,
        on_update: OnUpdate | None,
        prior: PriorOutcomes | None,
        started_at: float,
    ) -> None:
        self.targets = {t.pid: t for t in targets}
        self.protected = protected
        self.use_pidfd = use_pidfd
        self.on_update = on_update
        self.started_at = started_at
        self.live: dict[int, Tracked] = {}
        """Processes with an identity we verified, keyed by PID, in discovery order."""
        self.outcomes: list[ProcessOutcome] = []
        self.notes: list[str] = []
        self.spared: dict[int, int] = {}
        """PID to start ticks of each process the kill left alone on purpose (a client of the
        coordinator in the engine's unit, e.g. the preStop hook): never a process of the
        engine's, even where a scan listed it before it connected."""
        self._prior = prior_run.by_pid((prior or {}).values())
        self._own_pgid = os.getpgid(0)
        self._started_boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)
        self._watch: Callable[[Tracked], None] = lambda _t: None

    def set_watch(self, watch: Callable[[Tracked], None]) -> None:
        """Called for every newly tracked process (the engine registers it for exit events)."""
        self._watch = watch

    # --- updates -------------------------------------------------------------------------

    def publish(self, outcome: ProcessOutcome) -> None:
        """Tell ``on_update`` that ``outcome`` changed; its errors never stop the kill."""
        if self.on_update is None:
            return
        try:
            self.on_update(outcome)
        except Exception:
            log.exception("on_update callback failed for pid %s", outcome.pid)

    def _record(self, outcome: ProcessOutcome) -> None:
        self.outcomes.append(outcome)
        self.publish(outcome)

    # --- discovery -----------------------------------------------------------------------

    def add_roots(self) -> None:
        """Step 2a: open and verify each target's root process."""
        try:
            boot = procfs.boot_time()
        except OSError as exc:
            # Without the boot time no start time can be checked, so no PID can be trusted
            # to be the target's: none is signalled, and each says why.
            for target in self.targets.values():
                member = Member(target.pid, None, 0, "", "", target.role, target.pid)
                self._unreachable(target.pid, member, "could not verify its identity (no "
                                  f"boot time: {exc}): not signalled")
            return
        for target in self.targets.values():
            member = Member(target.pid, None, 0, "", "", target.role, target.pid)
            self._admit(target.pid, member, expected_start=target.start_time, boot=boot)
        self._nest_roots()

    def _nest_roots(self) -> None:
        """A target inside another target's tree (adopting by pattern finds both) takes its
        place in that tree, so it is not ended together with its ancestor in the last tier."""
        if len(self.live) < 2:
            return  # one root cannot be inside another
        # Each chain up to PID 1 from the roots' own parents (read as they were admitted),
        # reading each other ancestor once for all chains: hundreds of roots under one
        # spawner read a handful of files, not a scan of the whole system.
        parent = procfs.ParentMap({pid: t.member.parent_pid or 0 for pid, t in self.live.items()})
        chains = {pid: procfs.chain(pid, parent) for pid in self.live}
        for pid in sorted(chains, key=lambda p: len(chains[p])):
            t = self.live[pid]
            for distance, ancestor in enumerate(chains[pid], start=1):
                top = self.live.get(ancestor)
                if top is None or not self.targets[top.member.root_pid].include_tree:
                    continue
                t.member = Member(
                    pid, chains[pid][0], top.member.depth + distance, t.member.name,
                    t.member.cmdline, t.member.role, top.member.root_pid,
                )
                t.outcome.depth, t.outcome.root_pid = t.member.depth, t.member.root_pid
                t.outcome.parent_pid = t.member.parent_pid
                break

    def _admit(
        self,
        pid: int,
        member: Member,
        *,
        boot: float,
        expected_start: float | None = None,
        expected_ticks: int | None = None,
    ) -> Tracked | None:
        """Open a pidfd, then verify identity; track the process or report it ``gone``.

        A failure on this one process (an error nobody foresaw included) is recorded on its
        outcome and never reaches the caller: the kill goes on with every other process.
        """
        try:
            return self._admit_one(pid, member, boot=boot, expected_start=expected_start,
                                   expected_ticks=expected_ticks)
        except Exception as exc:
            log.exception("could not track pid %s", pid)
            self._unreachable(pid, member, f"could not be tracked ({type(exc).__name__}: "
                              f"{exc}): not signalled")
            return None

    def _admit_one(
        self,
        pid: int,
        member: Member,
        *,
        boot: float,
        expected_start: float | None,
        expected_ticks: int | None,
    ) -> Tracked | None:
        fd, found, open_errno = self._open(pid)
        # Only a root can be a thread id: a /proc scan lists thread-group leaders alone. A
        # pidfd opened says it is a process (``pidfd_open`` refuses another thread's id with
        # EINVAL); without one, ``/proc/<pid>/status`` tells.
        if expected_ticks is None and fd is None and found:
            tgid = procfs.thread_group(pid)
            if tgid is not None and tgid != pid:
                # /proc/<tid> exists, but a thread is not a process: signalling it would
                # reach its whole thread group, a process nobody registered.
                self._unreachable(pid, member, f"PID {pid} is a thread of process {tgid}, "
                                  "not a process: left alone")
                return None
        open_error = self._open_failed(open_errno) if open_errno else ""
        stat = procfs.read_stat(pid)
        if stat is None or not found:
            self._close(fd)
            if member.is_root:
                self._gone(pid, member, None, "no such process")
            return None
        start = stat.start_time(boot)
        if expected_ticks is not None and stat.start_ticks != expected_ticks:
            # The process we saw in the scan ended and its PID was reused: not ours.
            self._close(fd)
            return None
        if expected_start is not None and not procfs.same_start(start, expected_start):
            self._close(fd)
            self._gone(pid, member, start, "PID reused: start time differs from the target's")
            return None
        name = stat.name
        member = Member(
            pid, member.parent_pid if member.parent_pid is not None else stat.ppid,
            member.depth, name, procfs.cmdline(pid), member.role, member.root_pid,
        )
        outcome = ProcessOutcome(
            pid=pid,
            name=name,
            start_time=start,
            cmdline=member.cmdline,
            root_pid=member.root_pid,
            parent_pid=member.parent_pid,
            depth=member.depth,
            role=member.role,
        )
        already_exited = stat.zombie or (fd is not None and pidfd.has_exited(fd))
        if already_exited:
            outcome.fate = Fate.GONE
            outcome.detail = "had already exited (a zombie) when found"
            outcome.exit_code = exit_code(fd, pid, stat.start_ticks)
            self._close(fd)
            self._record(outcome)
            return None
        if open_error:
            outcome.detail = open_error
        tracked = Tracked(outcome, member, stat.start_ticks, stat.pgid, fd)
        prior_run.carry_over(outcome, self._prior.get(pid, ()))
        self.live[pid] = tracked
        self._record(outcome)
        self._watch(tracked)
        return tracked

    def _open(self, pid: int) -> tuple[int | None, bool, int]:
        """A pidfd for ``pid`` (None without pidfds), whether the process exists, and the
        errno of a ``pidfd_open`` that failed for another reason (0 when none did)."""
        if not self.use_pidfd:
            return None, True, 0
        try:
            return os.pidfd_open(pid), True, 0
        except ProcessLookupError:
            return None, False, 0
        except OSError as exc:
            return None, True, exc.errno or errno.EIO

    def _open_failed(self, err: int) -> str:
        """Why a process is polled: its ``pidfd_open`` failed with ``err`` (noted once)."""
        if err in (errno.EMFILE, errno.ENFILE):
            note = "file descriptor limit reached: some processes are polled, not pidfd-watched"
        else:
            note = f"pidfd_open failed ({os.strerror(err)})"
        # The process is still ours to stop: signalled by PID, its exit found by polling.
        if note not in self.notes:
            self.notes.append(note)
        return f"{note}: signalled by PID and polled"

    def _unreachable(self, pid: int, member: Member, why: str) -> None:
        """A process the kill cannot act on: reported ``survived`` (it may well be running),
        so the outcome cannot read as graceful."""
        self._record(
            ProcessOutcome(
                pid=pid,
                name=member.name,
                root_pid=member.root_pid,
                depth=member.depth,
                role=member.role,
                fate=Fate.SURVIVED,
                detail=why,
            )
        )

    def _gone(self, pid: int, member: Member, start: float | None, why: str) -> None:
        self._record(
            ProcessOutcome(
                pid=pid,
                name=member.name,
                start_time=start,
                root_pid=member.root_pid,
                depth=member.depth,
                role=member.role,
                fate=Fate.GONE,
                detail=why,
            )
        )

    # --- exits ---------------------------------------------------------------------------

    def mark_exited(self, pid: int) -> None:
        """The process exited (its pidfd turned readable): settle its fate."""
        t = self.live.get(pid)
        if t is None or t.exited:
            return
        t.exited = True
        out = t.outcome
        out.ended_at = time.time()
        out.exit_code = exit_code(t.fd, pid, t.start_ticks)
        first_signal = out.signalled_at or out.killed_at
        if first_signal is not None:
            out.elapsed_ms = round((out.ended_at - first_signal) * 1000.0, 3)
        if out.killed_at is not None and out.exit_code in (None, -signal.SIGKILL):
            out.fate = Fate.KILLED
        else:
            out.fate = Fate.EXITED
            if first_signal is None:
                out.detail = "exited before it was signalled"
            else:
                out.detail = death_detail(out) or out.detail
        self.publish(out)

    def unsignalled(self) -> list[Tracked]:
        return [t for t in self.live.values() if not t.exited and not t.signalled]

    # --- the end -------------------------------------------------------------------------

    def finish(self, prior_only: Iterable[ProcessOutcome]) -> None:
        """Late exit codes, survivors, and closing every pidfd."""
        for t in self.live.values():
            out = t.outcome
            if t.exited and out.exit_code is None and t.fd is not None:
                out.exit_code = exit_code(t.fd, out.pid, t.start_ticks)
                out.detail = death_detail(out) or out.detail
            if not t.exited:
                out.fate = Fate.SURVIVED
                out.detail = out.detail or "still running at the deadline"
                self.publish(out)
            self._close(t.fd)
            t.fd = None
        for before in prior_only:
            self._record(before)

    def prior_not_found(self) -> list[ProcessOutcome]:
        """Outcomes of the previous run whose processes this run did not find alive."""
        return prior_run.not_found(self._prior, self.outcomes)

    @staticmethod
    def _close(fd: int | None) -> None:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
