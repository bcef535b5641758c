"""Facts about a process, and the refusals that protect what must never be signalled.

A process is identified by its PID *and* its start time: a PID whose start time changed now
belongs to another process. Registration and adoption refuse PID 1, the coordinator itself and
its ancestors (the kill engine refuses them again), kernel threads (PID 2, ``kthreadd``, and
its children), and, when the coordinator is confined to a subtree (``confine_to_pid``),
anything outside it. Only a thread-group leader is a process: the id of one of its other
threads (``/proc/<tid>`` exists too, hidden from listings) is not registered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from coordinator.errors import RefusedTarget, TargetNotFound

PROC = Path("/proc")
PF_KTHREAD = 0x00200000
"""``include/linux/sched.h``: the task is a kernel thread (field 9 of ``/proc/<pid>/stat``)."""
KTHREADD_PID = 2

START_TIME_TOLERANCE_S = 0.015
"""Two start times closer than this are the same process: clients derive start times from
``/proc/<pid>/stat`` in clock ticks (10 ms) and may round differently from psutil."""


@dataclass(frozen=True)
class ProcessFacts:
    """What the coordinator knows about one live process."""

    pid: int
    start_time: float
    name: str
    cmdline: str
    ppid: int


def facts(pid: int) -> ProcessFacts:
    """Read a live process's facts; ``TargetNotFound`` when it does not exist."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            start = proc.create_time()
            name = proc.name()
            ppid = proc.ppid()
            try:
                cmdline = " ".join(proc.cmdline())
            except psutil.AccessDenied:
                cmdline = ""
    except psutil.ZombieProcess as exc:
        raise TargetNotFound(pid, "the process has exited (zombie)") from exc
    except psutil.NoSuchProcess as exc:
        raise TargetNotFound(pid) from exc
    except psutil.AccessDenied as exc:
        raise TargetNotFound(pid, "the process cannot be inspected") from exc
    return ProcessFacts(pid=pid, start_time=start, name=name, cmdline=cmdline, ppid=ppid)


def same_start(a: float | None, b: float | None) -> bool:
    """Whether two start times name the same process (None matches anything)."""
    return a is None or b is None or abs(a - b) < START_TIME_TOLERANCE_S


def protected_pids() -> frozenset[int]:
    """PID 1, the coordinator and its ancestors: never registered, adopted or signalled."""
    pids = {1, os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pids.add(os.getppid())
    return frozenset(pids)


def refusal(pid: int) -> str | None:
    """Why ``pid`` must never be signalled, or None when it may be."""
    if pid == 1:
        return "PID 1 is the container's init"
    if pid == os.getpid():
        return "it is the coordinator itself"
    if pid in protected_pids():
        return "it is an ancestor of the coordinator"
    return None


def thread_group(pid: int) -> int:
    """The thread-group id (the process) ``pid`` belongs to: ``pid`` itself for a process,
    its leader's PID for another thread. ``TargetNotFound`` when there is no such task."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError) as exc:  # none, or it exited meanwhile
        raise TargetNotFound(pid) from exc
    except OSError as exc:
        raise TargetNotFound(pid, f"the process cannot be inspected ({exc.strerror})") from exc
    for line in text.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    raise TargetNotFound(pid, "no Tgid in its /proc status")


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state, ppid, …, flags at index 6)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _has_kthread_flag(fields: list[str] | None) -> bool:
    return fields is not None and len(fields) > 6 and bool(int(fields[6]) & PF_KTHREAD)


def is_kernel_thread(pid: int) -> bool:
    """Whether ``pid`` is a kernel thread: ``PF_KTHREAD`` set, or a child of ``kthreadd``
    (PID 2 when it is the kernel's; in a PID namespace PID 2 is an ordinary process and its
    children are not refused)."""
    fields = _stat_fields(pid)
    if _has_kthread_flag(fields):
        return True
    if fields is None or len(fields) < 2 or int(fields[1]) != KTHREADD_PID:
        return False
    return _has_kthread_flag(_stat_fields(KTHREADD_PID))


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants."""
    if pid == ancestor:
        return True
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def vet(pid: int, start_time: float | None = None, confine_to: int | None = None) -> ProcessFacts:
    """The facts of a process that may be registered or adopted, or the reason it may not.

    Raises ``RefusedTarget`` (protected, a kernel thread, or outside the confinement) or
    ``TargetNotFound`` (no such process, a thread that is not its process's leader, or its
    start time differs from ``start_time``).
    """
    why = refusal(pid)
    if why is not None:
        raise RefusedTarget(pid, why)
    leader = thread_group(pid)
    if leader != pid:
        raise TargetNotFound(
            pid, f"it is a thread of process {leader}, not a process (not its thread-group "
                 f"leader): register pid {leader}")
    if is_kernel_thread(pid):
        raise RefusedTarget(pid, "it is a kernel thread")
    found = facts(pid)
    if not same_start(start_time, found.start_time):
        raise TargetNotFound(
            pid, f"start time {start_time} does not match the live process ({found.start_time})"
        )
    if confine_to is not None and not descends_from(pid, confine_to):
        raise RefusedTarget(pid, f"it does not descend from pid {confine_to} (confined)")
    return found


def tree(pid: int) -> list[tuple[ProcessFacts, int]]:
    """The live process ``pid`` and its descendants, each with its depth (0 for the root)."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except psutil.Error:
        return []
    out: list[tuple[ProcessFacts, int]] = []
    depth: dict[int, int] = {pid: 0}
    for proc in [root, *children]:
        try:
            found = facts(proc.pid)
        except TargetNotFound:
            continue
        level = depth.get(found.ppid, -1) + 1 if proc.pid != pid else 0
        depth[proc.pid] = level
        out.append((found, level))
    return out
