"""Process file descriptors: signal and watch a process by a handle that PID reuse cannot fool.

A pidfd refers to one process for as long as it is open: signalling through it can never hit
a newer process that inherited the PID, and it becomes readable (poll/epoll) the moment the
process exits, which is how the kill engine learns of exits without polling.

Exit codes come from two places:

- ``waitid(P_PIDFD, ..., WNOWAIT)`` for the calling process's own children (``WNOWAIT`` leaves
  the zombie for whoever spawned it to reap, so a ``subprocess.Popen`` still gets its status);
- the kernel's ``PIDFD_GET_INFO`` ioctl with ``PIDFD_INFO_EXIT`` (Linux 6.15+) for any other
  process, once its parent has reaped it; while it is still a zombie, the ``exit_code`` field
  of ``/proc/<pid>/stat`` has the same status.

``support()`` detects once what the running kernel offers; callers fall back to polling
``/proc`` where pidfds are missing.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import select
import signal
import struct
from dataclasses import dataclass

from coordinator.kill import procfs, reaped

# From include/uapi/linux/pidfd.h. The struct is extensible: the kernel takes its size from
# the ioctl number, and VER0 (64 bytes, Linux 6.13) already ends with exit_code since 6.15:
#
#   struct pidfd_info {
#       __u64 mask;            offset  0
#       __u64 cgroupid;                8
#       __u32 pid, tgid, ppid;        16, 20, 24
#       __u32 ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;   28 .. 56
#       __s32 exit_code;              60   (raw wait status; was spare0[0] before 6.15)
#       __u32 coredump_mask;          64   (6.16+)
#       __u32 coredump_signal;        68   (6.17+)
#       __u64 supported_mask;         72   (6.17+)
#   };
PIDFD_INFO_PID = 1 << 0
PIDFD_INFO_CREDS = 1 << 1
PIDFD_INFO_CGROUPID = 1 << 2
PIDFD_INFO_EXIT = 1 << 3
PIDFD_INFO_SUPPORTED_MASK = 1 << 5
PIDFD_INFO_SIZE = 80
"""The size we pass: through ``supported_mask``. Older kernels accept a larger struct and
leave the fields they do not know zero."""

_PIDFS_IOCTL_MAGIC = 0xFF
_IOC_READ_WRITE = 3


def _iowr(magic: int, nr: int, size: int) -> int:
    """``_IOWR(magic, nr, size)`` on the generic ioctl layout (x86, arm64, riscv)."""
    return (_IOC_READ_WRITE << 30) | (size << 16) | (magic << 8) | nr


PIDFD_GET_INFO = _iowr(_PIDFS_IOCTL_MAGIC, 11, PIDFD_INFO_SIZE)

_HEADER = struct.Struct("=QQIII")  # mask, cgroupid, pid, tgid, ppid
_HEADER_MASK = struct.Struct("=Q")
_EXIT_CODE = struct.Struct("=i")
_EXIT_CODE_OFFSET = 60
_SUPPORTED_MASK = struct.Struct("=Q")
_SUPPORTED_MASK_OFFSET = 72


@dataclass(frozen=True, slots=True)
class PidfdInfo:
    """What ``PIDFD_GET_INFO`` answered."""

    mask: int
    cgroupid: int
    pid: int
    tgid: int
    ppid: int
    exit_status: int | None
    """Raw wait status when the kernel set ``PIDFD_INFO_EXIT`` (the process was reaped)."""
    supported_mask: int | None

    @property
    def exit_code(self) -> int | None:
        """subprocess convention: >= 0 exit status, < 0 killed by that signal."""
        return None if self.exit_status is None else os.waitstatus_to_exitcode(self.exit_status)


def pack_info_request(mask: int) -> bytearray:
    """A ``struct pidfd_info`` buffer asking for ``mask``."""
    buf = bytearray(PIDFD_INFO_SIZE)
    struct.pack_into("=Q", buf, 0, mask)
    return buf


def parse_info(buf: bytes | bytearray) -> PidfdInfo:
    """Decode a ``struct pidfd_info`` filled in by the kernel."""
    mask, cgroupid, pid, tgid, ppid = _HEADER.unpack_from(buf, 0)
    (status,) = _EXIT_CODE.unpack_from(buf, _EXIT_CODE_OFFSET)
    (supported,) = _SUPPORTED_MASK.unpack_from(buf, _SUPPORTED_MASK_OFFSET)
    return PidfdInfo(
        mask=mask,
        cgroupid=cgroupid,
        pid=pid,
        tgid=tgid,
        ppid=ppid,
        exit_status=status if mask & PIDFD_INFO_EXIT else None,
        supported_mask=supported if mask & PIDFD_INFO_SUPPORTED_MASK else None,
    )


def get_info(fd: int, mask: int = PIDFD_INFO_EXIT) -> PidfdInfo:
    """Ask the kernel about the process behind ``fd`` (raises OSError where unsupported)."""
    buf = pack_info_request(mask)
    fcntl.ioctl(fd, PIDFD_GET_INFO, buf)
    return parse_info(buf)


@dataclass(frozen=True, slots=True)
class Support:
    """What this kernel and Python offer."""

    pidfd: bool
    """``pidfd_open`` and ``pidfd_send_signal`` work: event-driven exits, race-free signals."""
    exit_info: bool
    """``PIDFD_GET_INFO`` reports exit status of processes that are not our children."""
    detail: str = ""


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split("-")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


@functools.cache
def support() -> Support:
    """Detect, once per process, whether pidfds and ``PIDFD_INFO_EXIT`` are available."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return Support(False, False, "this Python has no os.pidfd_open")
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return Support(False, False, f"pidfd_open failed: {os.strerror(exc.errno or 0)}")
    try:
        try:
            info = get_info(fd, PIDFD_INFO_SUPPORTED_MASK)
        except OSError as exc:
            return Support(True, False, f"PIDFD_GET_INFO unavailable: {exc.strerror}")
        if info.supported_mask is not None:
            has_exit = bool(info.supported_mask & PIDFD_INFO_EXIT)
            return Support(True, has_exit, "PIDFD_GET_INFO reports its supported mask")
        # 6.15 and 6.16 know PIDFD_INFO_EXIT but cannot say so; the version tells.
        has_exit = _kernel_at_least(6, 15)
        return Support(True, has_exit, "PIDFD_INFO_EXIT inferred from the kernel version")
    finally:
        os.close(fd)


def is_process(pid: int) -> bool | None:
    """Whether ``pid`` is a process (a thread-group leader), as ``pidfd_open`` tells: it
    refuses the id of any other thread (EINVAL). None when it cannot tell (no pidfds here,
    no such task, no descriptor left): ``/proc/<pid>/status`` does, at more cost."""
    if not support().pidfd:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        return False if exc.errno == errno.EINVAL else None
    os.close(fd)
    return True


def send_signal(fd: int, sig: int) -> bool:
    """Signal the process behind ``fd``; False when it has already exited (not an error)."""
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    return True


def has_exited(fd: int) -> bool:
    """True once the process behind ``fd`` has exited (zombie or reaped).

    ``poll``, not ``select``: ``select`` refuses fd numbers of 1024 and above, which a pod of
    a thousand processes (or a caller holding a thousand connections) reaches.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def child_exit_code(fd: int, *, by_pid: bool = False) -> int | None:
    """Exit code of our own exited child behind ``fd``, without reaping it.

    With ``by_pid``, ``fd`` is a PID (the fallback without pidfds; safe for a zombie, which
    keeps its PID until reaped). None when the process is not our child, has not exited,
    or was already reaped.
    """
    idtype = os.P_PID if by_pid else os.P_PIDFD
    try:
        result = os.waitid(idtype, fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ESRCH):
            return None
        raise
    if result is None:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    if result.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -result.si_status
    return None


def reaped_exit_code(fd: int) -> int | None:
    """Exit code the kernel kept for a reaped process (``PIDFD_INFO_EXIT``), else None."""
    buf = pack_info_request(PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    if not _HEADER_MASK.unpack_from(buf, 0)[0] & PIDFD_INFO_EXIT:
        return None
    return os.waitstatus_to_exitcode(_EXIT_CODE.unpack_from(buf, _EXIT_CODE_OFFSET)[0])


def exit_code(fd: int, pid: int, start_ticks: int) -> int | None:
    """Best knowledge of the exit code of the exited process behind ``fd``.

    Reaped by this process (the engine's init): its own record (``reaped``). Reaped by its
    parent: ``PIDFD_GET_INFO`` (asked next where the kernel has it: engine processes are
    seldom ours, and are reaped at once by their parent). Our child: ``waitid``. Still a
    zombie: the status in ``/proc/<pid>/stat``, trusted only when the start time there is
    still ours (the zombie holds its PID, so it cannot have been reused while it is a zombie).
    """
    code = reaped.lookup(pid, start_ticks)
    if code is not None:
        return code
    has_info = support().exit_info
    if has_info:
        code = reaped_exit_code(fd)
        if code is not None:
            return code
    code = child_exit_code(fd)
    if code is not None:
        return code
    if not has_info:
        code = reaped_exit_code(fd)
        if code is not None:
            return code
    stat = procfs.read_stat(pid)
    if stat is not None and stat.start_ticks == start_ticks and stat.exit_status is not None:
        return os.waitstatus_to_exitcode(stat.exit_status)
    # It may have been reaped between the ioctl and the read.
    return reaped_exit_code(fd)
