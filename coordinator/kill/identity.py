"""Which process a PID names, and whether it may be registered, adopted or signalled.

A process is identified by its PID *and* its start time: a PID whose start time changed now
belongs to another process. ``same_start`` compares two start times; it lives in ``procfs``
beside the reader of start times, where the kill table compares them too, and
``procfs.START_TIME_TOLERANCE_S`` says why half a clock tick is the tolerance.

Registration and adoption refuse what ``safety`` refuses (PID 1, the coordinator itself and
its ancestors; the kill engine refuses them again), kernel threads (``PF_KTHREAD``, or a
child of the kernel's ``kthreadd``), and, when the coordinator is confined to a subtree
(``confine_to_pid``), anything outside it. Only a thread-group leader is a process: the id of
one of its other threads (``/proc/<tid>`` exists too, hidden from listings) is not
registered.

Every fact is read from ``/proc`` through ``procfs``, the kill engine's own reader, so the
service and the kill agree on a start time to the bit and on who is protected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from coordinator.errors import RefusedTarget, TargetNotFound
from coordinator.kill import pidfd, procfs, safety
from coordinator.kill.procfs import same_start

__all__ = [
    "ProcessFacts",
    "descends_from",
    "display_name",
    "facts",
    "is_kernel_thread",
    "same_start",
    "thread_group",
    "vet",
]

KTHREADD_PID = 2
COMM_LENGTH = 15
"""``TASK_COMM_LEN - 1``: the kernel cuts a process's name (``comm``) to this many characters."""


@dataclass(frozen=True)
class ProcessFacts:
    """What the coordinator knows about one live process."""

    pid: int
    start_time: float
    """Epoch seconds, as psutil's ``create_time()`` and ``worker_client`` compute it."""
    name: str
    cmdline: str
    ppid: int


def display_name(comm: str, cmdline: str) -> str:
    """The process's name: ``comm``, or, when the kernel cut it, the base name of the first
    word of the command line that it begins (psutil's ``name()`` rule)."""
    if len(comm) >= COMM_LENGTH and cmdline:
        full = os.path.basename(cmdline.split(" ", 1)[0])
        if full.startswith(comm):
            return full
    return comm


def facts(pid: int) -> ProcessFacts:
    """Read a live process's facts; ``TargetNotFound`` when it does not exist (or is a zombie:
    it has ended and only waits to be reaped)."""
    return _facts(pid, procfs.read_stat(pid))


def _facts(pid: int, stat: procfs.ProcStat | None) -> ProcessFacts:
    if stat is None:
        raise TargetNotFound(pid)
    if stat.zombie:
        raise TargetNotFound(pid, "the process has exited (zombie)")
    cmdline = procfs.cmdline(pid)
    return ProcessFacts(pid=pid, start_time=stat.start_time(procfs.boot_time()),
                        name=display_name(stat.name, cmdline), cmdline=cmdline,
                        ppid=stat.ppid)


def thread_group(pid: int) -> int:
    """The thread-group id (the process) ``pid`` belongs to: ``pid`` itself for a process,
    its leader's PID for another thread. ``TargetNotFound`` when there is no such task."""
    if pidfd.is_process(pid):
        return pid
    leader = procfs.thread_group(pid)
    if leader is None:
        raise TargetNotFound(pid)
    return leader


def is_kernel_thread(pid: int) -> bool:
    """Whether ``pid`` is a kernel thread: ``PF_KTHREAD`` set, or a child of ``kthreadd``
    (PID 2 when it is the kernel's; in a PID namespace PID 2 is an ordinary process and its
    children are not refused)."""
    return _kernel_thread(procfs.read_stat(pid))


def _kernel_thread(stat: procfs.ProcStat | None) -> bool:
    if stat is None:
        return False
    if stat.kernel_thread:
        return True
    if stat.ppid != KTHREADD_PID:
        return False
    kthreadd = procfs.read_stat(KTHREADD_PID)
    return kthreadd is not None and kthreadd.kernel_thread


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants."""
    if pid == ancestor:
        return True
    try:
        return ancestor in procfs.ancestors(pid)
    except OSError:
        return False


def vet(pid: int, start_time: float | None = None, confine_to: int | None = None, *,
        protected: frozenset[int] | None = None) -> ProcessFacts:
    """The facts of a process that may be registered or adopted, or the reason it may not.

    Raises ``RefusedTarget`` (protected, a kernel thread, or outside the confinement) or
    ``TargetNotFound`` (no such process, a thread that is not its process's leader, or its
    start time differs from ``start_time``). ``protected``: ``safety.protected_pids()`` as a
    caller vetting many processes at once read it.
    """
    why = safety.refusal(pid, safety.protected_pids() if protected is None else protected)
    if why is not None:
        raise RefusedTarget(pid, why)
    leader = thread_group(pid)
    if leader != pid:
        raise TargetNotFound(
            pid, f"it is a thread of process {leader}, not a process (not its thread-group "
                 f"leader): register pid {leader}")
    stat = procfs.read_stat(pid)
    if _kernel_thread(stat):
        raise RefusedTarget(pid, "it is a kernel thread")
    found = _facts(pid, stat)
    if not same_start(start_time, found.start_time):
        raise TargetNotFound(
            pid, f"start time {start_time} does not match the live process ({found.start_time})"
        )
    if confine_to is not None and not descends_from(pid, confine_to):
        raise RefusedTarget(pid, f"it does not descend from pid {confine_to} (confined)")
    return found
