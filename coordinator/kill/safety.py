"""The processes the kill engine never signals: PID 1, the calling process, its ancestors.

Signalling PID 1 ends the container; signalling ourselves or a parent of ours (the shell or
supervisor that started the coordinator) would end the thing running the kill. PIDs <= 0 are
refused as well: ``kill(0, …)`` and ``kill(-n, …)`` address whole process groups.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from coordinator.errors import RefusedTarget
from coordinator.kill import procfs


def protected_pids() -> frozenset[int]:
    """PID 1, the calling process and every ancestor of it, as of now."""
    return frozenset({1, os.getpid(), *procfs.ancestors()})


def refusal(pid: int, protected: frozenset[int]) -> str | None:
    """Why ``pid`` must not be signalled, or None when it may be."""
    if pid <= 0:
        return "not a single process (kill() would address a process group)"
    if pid == 1:
        return "PID 1 is the container's (or the system's) init"
    if pid == os.getpid():
        return "it is the calling process"
    if pid in protected:
        return "it is an ancestor of the calling process"
    return None


def check_targets(pids: Iterable[int]) -> frozenset[int]:
    """Raise ``RefusedTarget`` for the first refused PID; return the protected set otherwise.

    Called before anything is signalled, so a refused target aborts the whole kill.
    """
    protected = protected_pids()
    for pid in pids:
        why = refusal(pid, protected)
        if why is not None:
            raise RefusedTarget(pid, why)
    return protected
