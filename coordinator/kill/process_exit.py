"""An ended process's exit code: where it is read from, and what it says about the end.

``exit_code`` follows ``subprocess``: ``>= 0`` is the exit status, ``< 0`` the signal that
killed it, ``None`` unknown. It is read, in this order, from what this process reaped itself
(``reaped``: the engine's init), from the pidfd (``waitid`` for our own children,
``PIDFD_GET_INFO`` once another parent reaped it), from ``waitid`` by PID without a pidfd,
and from a zombie's ``/proc/<pid>/stat`` while its start ticks are still the tracked
process's.
"""

from __future__ import annotations

import logging
import os
import signal

from coordinator.kill import pidfd, procfs, reaped
from coordinator.kill.report import ProcessOutcome

log = logging.getLogger(__name__)


def exit_code(fd: int | None, pid: int, start_ticks: int) -> int | None:
    """The exit code of the process ``pid`` started at ``start_ticks``; ``None`` when unknown
    (an error reading it is logged, never raised)."""
    try:
        return _read_exit_code(fd, pid, start_ticks)
    except OSError:
        log.exception("could not read the exit code of pid %s", pid)
        return None


def _read_exit_code(fd: int | None, pid: int, start_ticks: int) -> int | None:
    if fd is not None:
        return pidfd.exit_code(fd, pid, start_ticks)
    code = reaped.lookup(pid, start_ticks)
    if code is not None:
        return code
    code = pidfd.child_exit_code(pid, by_pid=True)
    if code is not None:
        return code
    stat = procfs.read_stat(pid)
    if stat is not None and stat.start_ticks == start_ticks and stat.exit_status is not None:
        return os.waitstatus_to_exitcode(stat.exit_status)
    return None


def death_detail(out: ProcessOutcome) -> str:
    """Why an exit after the graceful signal is not a clean one, or ``""`` when it is."""
    code = out.exit_code
    if code is None or code == 0:
        return ""
    if code > 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if out.signal == name and out.killed_at is None:
        return f"died of {name}'s default action: no handler ran, so no cleanup"
    return f"died of {name}"
