"""Reaping: every exited child of this process, collected in one place that keeps its status.

As a container's PID 1, every process whose parent dies is reparented here; elsewhere
``PR_SET_CHILD_SUBREAPER`` makes this process the one they are reparented to, instead of the
host's init. Either way each of them becomes a zombie here when it exits, and only a
``wait`` here removes it. ``Reaper.reap`` does that for every exited child, in two steps
per child so the status is never separated from the process's identity:

1. ``waitid(P_ALL, WNOWAIT)`` names one exited child without reaping it; while it is a
   zombie its PID cannot be reused, so its ``/proc/<pid>/stat`` start ticks are its own;
2. ``waitid(P_PID, pid)`` reaps exactly that child, and its status goes into the kill's
   book (``coordinator.kill.reaped``) under PID and start ticks, in the same step: the kill
   engine and the worker registry, which read exit codes through pidfds on the same event
   loop, find it there once the zombie is gone.

Nothing else in this process may wait for children (no ``subprocess``, no asyncio child
watcher): a second reaper would take statuses this one never records.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.kill import procfs, reaped

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
"""``include/uapi/linux/prctl.h``."""


@dataclass(frozen=True, slots=True)
class Reaped:
    """One child collected: who it was and how it ended."""

    pid: int
    start_ticks: int | None
    """None when its ``/proc`` entry could not be read (its status is then not in the book)."""
    exit_code: int
    """``subprocess`` convention: ``>= 0`` its exit status, ``< 0`` the signal that killed it."""


def become_subreaper() -> None:
    """Make orphaned descendants of this process its children (``OSError`` on failure)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def exit_code_of(info: os.waitid_result) -> int | None:
    """A ``waitid`` result as an exit code (``subprocess`` convention), None when it is not
    an exit."""
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return None


class Reaper:
    """Reaps every exited child; ``on_reaped`` hears of each one, after its record."""

    def __init__(self, on_reaped: Callable[[Reaped], None]) -> None:
        self._on_reaped = on_reaped
        self.count = 0
        """Children reaped so far."""

    def reap(self) -> list[Reaped]:
        """Collect every child that has exited by now (never blocks); returns them."""
        collected: list[Reaped] = []
        while True:
            # Step 1: one exited child, left a zombie.
            try:
                peek = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break  # no child at all
            if peek is None or peek.si_pid == 0:
                break  # children, none exited
            pid = peek.si_pid
            stat = _stat(pid)
            # Step 2: reap that one, and record its status before anything else runs.
            try:
                done = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                continue  # someone else reaped it after all
            if done is None:
                continue
            code = exit_code_of(done)
            if code is None:
                continue
            ticks = stat.start_ticks if stat is not None else None
            if ticks is not None:
                reaped.record(pid, ticks, code)
            self.count += 1
            found = Reaped(pid, ticks, code)
            collected.append(found)
            try:
                self._on_reaped(found)
            except Exception:
                log.exception("after reaping pid %s", pid)
        return collected

    @staticmethod
    def has_children() -> bool:
        """Whether any child of this process still exists (running or a zombie)."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return True


def _stat(pid: int) -> procfs.ProcStat | None:
    try:
        return procfs.read_stat(pid)
    except OSError:
        log.warning("could not read /proc/%s/stat of an exited child: its exit code is "
                    "known here only", pid)
        return None
