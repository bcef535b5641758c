"""The kernel's own record of how each process in a pod ended: its wait status.

Inside a pod, the engine's processes are nobody's children that a test could wait for: the
container's main process is conmon's, the others are the main process's or the pause
process's. The kernel tells anyone listening (root only) through the proc connector
(``NETLINK_CONNECTOR``, ``CN_IDX_PROC``, linux/cn_proc.h): one message per fork and per exit
on the whole machine, the exit carrying the wait status the parent will see. ``ProcessExits``
listens for the length of a pod's life, keeps the forks and exits it sees, and answers for a
set of processes (the pod's, taken from ``/proc`` while it runs, and everything they forked
afterwards) how each one ended: exit code, or the signal that killed it. That is the ground
truth for "exited 0", "died of SIGTERM's default action" and "SIGKILLed", whoever sent it.

Messages can be lost when the socket's buffer overflows (``ENOBUFS``, counted in
``overruns``); a test that needs a process's end fails rather than guess it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
_NLMSGHDR = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_FORK = struct.Struct("=IIII")  # parent pid, parent tgid, child pid, child tgid
_EXIT = struct.Struct("=IIII")  # pid, tgid, exit_code (wait status), exit_signal
_BODY = _NLMSGHDR.size + _CN_MSG.size + _EVENT_HEAD.size
RECEIVE_BUFFER = 8 << 20


@dataclass(frozen=True)
class End:
    """How one process ended, from its wait status."""

    pid: int
    status: int
    at: float
    """``time.time()`` when the message was read."""

    @property
    def signal(self) -> int | None:
        """The signal that killed it, or None when it exited."""
        return (self.status & 0x7F) or None

    @property
    def exit_code(self) -> int | None:
        return None if self.signal else (self.status >> 8) & 0xFF

    def describe(self) -> str:
        if self.signal:
            return f"killed by {signal.Signals(self.signal).name}"
        return f"exit {self.exit_code}"


class ProcessExits:
    """Listen to the kernel's fork and exit messages until ``close()``."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self._sock.bind((0, CN_IDX_PROC))
        self._lock = threading.Lock()
        self._children: dict[int, list[tuple[int, float]]] = {}
        self._parents: dict[int, int] = {}
        self._ends: dict[int, list[End]] = {}
        self.overruns = 0
        self._stop_r, self._stop_w = os.pipe()
        self._tell(PROC_CN_MCAST_LISTEN)
        self._thread = threading.Thread(target=self._read, name="proc-connector", daemon=True)
        self._thread.start()

    def _tell(self, op: int) -> None:
        payload = struct.pack("=I", op)
        cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
        self._sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn)

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._sock.fileno(), self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = self._sock.recv(65536)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overruns += 1
                    continue
                return
            self._parse(data, time.time())

    def _parse(self, data: bytes, now: float) -> None:
        offset = 0
        while offset + _BODY <= len(data):
            length = _NLMSGHDR.unpack_from(data, offset)[0]
            what = _EVENT_HEAD.unpack_from(data, offset + _NLMSGHDR.size + _CN_MSG.size)[0]
            body = offset + _BODY
            if what == PROC_EVENT_FORK:
                _, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(data, body)
                if child_pid == child_tgid:  # a process, not a thread
                    with self._lock:
                        self._children.setdefault(parent_tgid, []).append((child_tgid, now))
                        self._parents[child_tgid] = parent_tgid
            elif what == PROC_EVENT_EXIT:
                pid, tgid, status, _ = _EXIT.unpack_from(data, body)
                if pid == tgid:  # the thread group's leader: the process's own status
                    with self._lock:
                        self._ends.setdefault(tgid, []).append(End(tgid, status, now))
            if length < _NLMSGHDR.size:
                return
            offset += (length + 3) & ~3

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        with contextlib.suppress(OSError):
            self._tell(PROC_CN_MCAST_IGNORE)
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=10)
        self._sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def __enter__(self) -> ProcessExits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Answers.

    def descendants(self, pids: set[int], after: float) -> set[int]:
        """``pids`` and every process they (and theirs) forked after ``after``."""
        with self._lock:
            found = set(pids)
            todo = list(pids)
            while todo:
                for child, at in self._children.get(todo.pop(), ()):
                    if at >= after and child not in found:
                        found.add(child)
                        todo.append(child)
        return found

    def parent_of(self, pid: int) -> int | None:
        """Who forked ``pid`` (as last seen: PIDs are reused)."""
        with self._lock:
            return self._parents.get(pid)

    def end_of(self, pid: int, after: float = 0.0) -> End | None:
        """The first end of ``pid`` read after ``after`` (a PID can be reused), or None."""
        with self._lock:
            for end in self._ends.get(pid, ()):
                if end.at >= after:
                    return end
        return None

    def wait_for(self, pids: set[int], after: float, timeout: float) -> dict[int, End]:
        """The end of each of ``pids``; waits up to ``timeout`` for the last messages to be
        read (an exit is told before the parent reaps it)."""
        deadline = time.monotonic() + timeout
        while True:
            ends = {pid: end for pid in pids if (end := self.end_of(pid, after)) is not None}
            if len(ends) == len(pids) or time.monotonic() > deadline:
                return ends
            time.sleep(0.05)


def unavailable() -> str | None:
    """Why the proc connector cannot be read here, or None."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR) as sock:
            sock.bind((0, CN_IDX_PROC))
    except OSError as exc:
        return f"the kernel's proc connector cannot be read here: {exc}"
    return None
