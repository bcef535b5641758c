"""The few Linux facilities the simulated engine needs: PDEATHSIG and waiting on pidfds."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from collections.abc import Iterable

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent thread exits.

    This is what SGLang's ``kill_itself_when_parent_died`` does; a SIGKILL delivered this way
    interrupts whatever cleanup the child is running.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None when the process is already gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def wait_for_exits(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Block until every process in ``pids`` has exited or ``timeout_s`` passed.

    Exit is an event (the pidfd turns readable), not a sleep loop. Returns the PIDs still
    running. Zombies count as exited; reaping them is the caller's business.
    """
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            fd = open_pidfd(pid)
            if fd is not None:
                fds[fd] = pid
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        alive = dict(fds)
        while alive:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            events = poller.poll(left_ms)
            for fd, _ in events:
                alive.pop(fd, None)
                poller.unregister(fd)
            if not events and time.monotonic() >= deadline:
                break
        return set(alive.values())
    finally:
        for fd in fds:
            os.close(fd)


def send_signal(pid: int, signum: int) -> bool:
    """Signal ``pid``; False when it is already gone (which is not an error)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def reap(pid: int) -> int | None:
    """Collect an exited child's status without blocking; subprocess-style exit code."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got == 0:
        return None
    return os.waitstatus_to_exitcode(status)


__all__ = [
    "open_pidfd",
    "reap",
    "send_signal",
    "set_parent_death_signal",
    "wait_for_exits",
]
