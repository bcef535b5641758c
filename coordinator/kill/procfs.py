"""Process facts read from ``/proc``: identity (start time), parent, group, name, command line.

Start times are computed exactly as psutil's ``Process.create_time()`` does (``starttime``
clock ticks since boot divided by ``SC_CLK_TCK``, plus ``btime`` from ``/proc/stat``), so a
start time recorded by psutil elsewhere compares equal to one read here. Reading ``/proc``
directly instead of going through psutil keeps a whole-system scan cheap enough to repeat
between tiers while hundreds of processes are shutting down.
"""

from __future__ import annotations

import errno
import functools
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

START_TIME_TOLERANCE_S = 0.5 / CLOCK_TICKS
"""Two start times closer than half a clock tick are the same process's.

The kernel keeps a start time in whole clock ticks (10 ms at 100 Hz), and every reader turns
it into epoch seconds with the same formula: ``btime`` (whole seconds) plus ``starttime /
SC_CLK_TCK``. That is what this module does, what psutil's ``create_time()`` does, and what
``worker_client``'s ``process_start_time`` sends in its registration, so those three agree
bit for bit; the tolerance is only for clients that round the value (to the millisecond, say)
on the way. Half a tick takes any such rounding and never takes the next tick: a 15 ms
tolerance would have called a process started one tick later (a reused PID) the same."""

PF_KTHREAD = 0x00200000
"""``include/linux/sched.h``: the task is a kernel thread (``flags``, field 9 of stat)."""

PROC = "/proc"


@dataclass(slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the kill engine needs; read-only by convention (not
    ``frozen``: a scan of the whole system makes one per process, and a frozen dataclass's
    ``__init__`` costs three times as much)."""

    pid: int
    name: str
    """``comm``: the executable name, at most 15 characters."""
    state: str
    """One letter: ``R``, ``S``, ``D``, ``Z`` (zombie: exited, not yet reaped), ..."""
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    """Clock ticks from boot to the process's creation; never changes for a process."""
    exit_status: int | None
    """Raw wait status (as ``waitpid`` gives it) once the process is a zombie; else None, and
    None too when the kernel hides it from this reader (``read_stat``)."""
    flags: int = 0
    """The kernel's ``PF_*`` flags of the task (``PF_KTHREAD`` marks a kernel thread)."""

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    def start_time(self, boot: float) -> float:
        """Start time in epoch seconds, given ``boot_time()``."""
        return self.start_ticks / CLOCK_TICKS + boot


@functools.cache
def boot_time() -> float:
    """System boot time (epoch seconds), as psutil reads it; read once (a failed read is
    not remembered), so a kill that has run out of file descriptors still has it."""
    with open(f"{PROC}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise RuntimeError("no btime line in /proc/stat")


READ_SIZE = 4096
"""One read takes a whole ``stat``, ``status`` or ``cgroup`` file (they are generated whole,
so a short read is their end); longer files (a command line) take more."""


def read_file(path: str) -> bytes:
    """A ``/proc`` file's bytes, read with plain system calls: a scan reads thousands of
    them, and a text-mode ``open`` (buffer, decoder) costs more than the kernel's own work.
    Raises what ``os.open`` and ``os.read`` raise."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, READ_SIZE)
        if len(data) < READ_SIZE:
            return data
        chunks = [data]
        while chunk := os.read(fd, READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_stat(text: bytes | str) -> ProcStat:
    """Parse the text of ``/proc/<pid>/stat``.

    ``comm`` sits in parentheses and may itself contain spaces and parentheses, so the
    fields after it are found from the last ``)``. It is the kernel's bytes, shown as text
    (bytes that are not UTF-8 replaced).
    """
    data = text.encode() if isinstance(text, str) else text
    open_at = data.index(b"(")
    close_at = data.rindex(b")")
    rest = data[close_at + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    state = rest[0].decode()
    zombie = state in ("Z", "X")
    return ProcStat(
        pid=int(data[:open_at]),
        name=data[open_at + 1 : close_at].decode(errors="replace"),
        state=state,
        ppid=int(rest[4 - 3]),
        pgid=int(rest[5 - 3]),
        sid=int(rest[6 - 3]),
        start_ticks=int(rest[22 - 3]),
        exit_status=(int(rest[52 - 3]) if len(rest) > 52 - 3 else 0) if zombie else None,
        flags=int(rest[9 - 3]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None when no process has that PID.

    A zombie's exit status of 0 is kept only when this process may see it: the kernel shows
    the status only to a reader allowed to inspect the process (``do_task_stat``'s
    ``permitted``) and writes 0 for anyone else, so a 0 another user's process, or a root
    process with more capabilities than this one, died with would read as a clean exit
    (``exit_status_visible``)."""
    try:
        data = read_file(f"{PROC}/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        # ESRCH while the process is being torn down reads as "gone" as well; running out
        # of file descriptors says nothing about the process and must not read as "gone".
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise
        return None
    if not data:
        return None  # torn down between the open and the read
    stat = parse_stat(data)
    if stat.exit_status == 0 and not exit_status_visible(pid):
        return replace(stat, exit_status=None)
    return stat


def exit_status_visible(pid: int) -> bool:
    """Whether the kernel shows this process the real exit status in ``pid``'s stat.

    It does when this process may inspect ``pid`` (``ptrace_may_access`` in read mode: the
    same user and, without ``CAP_SYS_PTRACE``, every capability ``pid`` holds). The same
    check guards ``/proc/<pid>/cwd``: it is refused (EACCES) when not allowed; allowed, a
    zombie's (whose working directory is released) is ENOENT, a live process's a path."""
    try:
        os.readlink(f"{PROC}/{pid}/cwd")
    except PermissionError:
        return False
    except OSError:
        return True
    return True


def start_time(pid: int) -> float | None:
    """The process's start time (epoch seconds, psutil's ``create_time``), None if gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_time(boot_time())


def same_start(a: float | None, b: float | None) -> bool:
    """True when two start times denote the same process creation (``START_TIME_TOLERANCE_S``).

    None matches anything: a registration may leave its start time out (a client that could
    not read ``/proc``), and then the PID alone names the process, as the caller asked."""
    return a is None or b is None or abs(a - b) < START_TIME_TOLERANCE_S


def thread_group(pid: int) -> int | None:
    """The thread-group id (the process) ``pid`` belongs to; ``pid`` itself for a process,
    another PID when ``pid`` is a thread id, None when gone. ``/proc/<tid>`` answers for
    threads although ``/proc`` does not list them."""
    try:
        data = read_file(f"{PROC}/{pid}/status")
        at = data.index(b"\nTgid:") + 6
        return int(data[at : data.index(b"\n", at)])
    except (OSError, ValueError):
        return None


def uids(pid: int, start_ticks: int | None = None) -> tuple[int, int] | None:
    """The process's real and saved UIDs (what ``kill(2)`` compares a sender's UID with), as
    our user namespace sees them; None when it is gone, or (given ``start_ticks``) when the
    PID now names another process."""
    try:
        with open(f"{PROC}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real, _effective, saved = line.split()[1:4]
                    break
            else:
                return None
    except (OSError, ValueError):
        return None
    if start_ticks is not None:
        # Read after the status: the same start ticks mean it was that process's.
        stat = read_stat(pid)
        if stat is None or stat.start_ticks != start_ticks:
            return None
    return int(real), int(saved)


def cmdline(pid: int) -> str:
    """The command line joined by spaces; empty for kernel threads, zombies, or when gone."""
    try:
        raw = read_file(f"{PROC}/{pid}/cmdline")
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def pids() -> list[int]:
    """The PID of every process on the system right now (``/proc`` does not list threads)."""
    return [int(entry) for entry in os.listdir(PROC) if entry.isdigit()]


def snapshot() -> dict[int, ProcStat]:
    """Every process on the system right now, by PID (one pass over ``/proc``)."""
    out: dict[int, ProcStat] = {}
    for pid in pids():
        stat = read_stat(pid)
        if stat is not None:
            out[stat.pid] = stat
    return out


def children_by_parent(procs: Iterable[ProcStat]) -> dict[int, list[int]]:
    """Map each PID to the PIDs whose parent it is."""
    out: dict[int, list[int]] = {}
    for p in procs:
        out.setdefault(p.ppid, []).append(p.pid)
    return out


def descendants(
    pid: int, procs: Mapping[int, ProcStat], kids: Mapping[int, list[int]] | None = None
) -> list[tuple[int, int]]:
    """``(pid, depth)`` of every descendant of ``pid`` in ``procs``, breadth first."""
    kids = children_by_parent(procs.values()) if kids is None else kids
    out: list[tuple[int, int]] = []
    frontier = deque([(pid, 0)])
    seen = {pid}
    while frontier:
        parent, depth = frontier.popleft()
        for child in kids.get(parent, ()):
            if child not in seen:
                seen.add(child)
                out.append((child, depth + 1))
                frontier.append((child, depth + 1))
    return out


class ParentMap(dict[int, int]):
    """``{pid: ppid}`` that reads a PID it does not hold from ``/proc`` (0 once gone), once:
    ``chain`` over it reads only the ancestors nobody knew yet."""

    def get(self, pid: int, default: int = 0) -> int:  # type: ignore[override]
        if pid not in self:
            stat = read_stat(pid) if pid > 0 else None
            self[pid] = default if stat is None else stat.ppid
        return self[pid]


def chain(pid: int, parent: Mapping[int, int]) -> list[int]:
    """The parent chain of ``pid`` in a ``{pid: ppid}`` map, nearest first, up to PID 1."""
    out: list[int] = []
    seen = {pid}
    current = parent.get(pid, 0)
    while current > 0 and current not in seen:
        out.append(current)
        seen.add(current)
        current = parent.get(current, 0)
    return out


_last_own_chain: list[int] = []


def ancestors(pid: int | None = None) -> list[int]:
    """The parent chain of ``pid`` (default: the calling process), nearest first, up to PID 1.

    The calling process's own chain never comes back short for want of a file descriptor:
    when ``/proc`` cannot be opened (the fd limit is reached), the walk falls back on the
    parent the kernel reports without a file (``getppid``) and the last chain read whole, so
    the kill engine's refusal of its own ancestors holds exactly when fds run out. For any
    other PID the error is raised.
    """
    own = pid is None
    current = os.getpid() if pid is None else pid
    out: list[int] = []
    seen = {current}
    while True:
        try:
            stat = read_stat(current)
        except OSError:
            if not own:
                raise
            known = [os.getppid(), *_last_own_chain]
            return out + [p for p in dict.fromkeys(known) if p not in seen and p > 0]
        if stat is None or stat.ppid <= 0 or stat.ppid in seen:
            if own:
                _last_own_chain[:] = out
            return out
        out.append(stat.ppid)
        seen.add(stat.ppid)
        current = stat.ppid
