"""The processes of a pod, as the node sees them in ``/proc``: host PID, PID in the pod's
namespace, name, command line, start time."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PodProcess:
    """A process in a pod, as the host sees it."""

    host_pid: int
    pod_pid: int
    name: str
    cmdline: str
    start_ticks: int


def _pid_ns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def pod_pid(host_pid: int) -> int | None:
    """``host_pid``'s PID in its own PID namespace (the last of ``NSpid``)."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except OSError:
        return None
    return None


def pod_processes(member: int) -> list[PodProcess]:
    """Every process in the PID namespace of ``member`` (the pod's pause process, or a
    container's main process when the pod's containers have namespaces of their own)."""
    namespace = _pid_ns(member)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or _pid_ns(int(entry)) != namespace:
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        inner = pod_pid(pid)
        if inner is not None:
            found.append(PodProcess(pid, inner, name, cmdline.decode(errors="replace").strip(),
                                    ticks))
    return found




def running(host_pid: int | None, ticks: int | None) -> bool:
    """The process started at ``ticks`` still runs as ``host_pid`` (not a zombie)."""
    if host_pid is None:
        return False
    try:
        stat = Path(f"/proc/{host_pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] not in ("Z", "X") and int(fields[19]) == ticks
