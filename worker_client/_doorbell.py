"""The worker's end of the coordinator's doorbell: a named pipe watched on the engine's loop.

The coordinator writes one byte into the pipe when a drain starts; that one write makes the
pipe readable for every worker of the pod at once, before the coordinator has written any
worker's ``drain`` line (see ``coordinator/service/doorbell.py``). Nobody reads the byte:
each worker stops watching once it has seen it, and watches again after an ``abort`` (the
coordinator has taken the byte back by then). Readable with nothing in the pipe means the
coordinator is gone (its end is closed): the pipe is dropped, the next ``hello`` names the new
one.

Everything here runs on the engine's loop; failures only log: the stream's ``drain`` line
still comes.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import os
import stat
import termios
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("worker_client")


class DoorbellWatch:
    """Watches at most one pipe on ``loop``; calls ``on_ring`` (on the loop) when it rings."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_ring: Callable[[], None]) -> None:
        self._loop = loop
        self._on_ring = on_ring
        self._fd: int | None = None
        self._key: tuple[str, int, int] | None = None
        self._watching = False

    @property
    def watching(self) -> bool:
        return self._watching

    def arm(self, info: Mapping[str, Any] | None) -> None:
        """Watch the pipe a ``hello`` named (opening it unless it is the one already open)."""
        key = _key(info)
        if key is None:
            self.close()
            return
        if key != self._key:
            self.close()
            fd = _open_verified(*key)
            if fd is None:
                return
            self._fd, self._key = fd, key
        self.rearm()

    def rearm(self) -> None:
        """Watch the open pipe again (after an ``abort``)."""
        if self._fd is not None and not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True

    def close(self) -> None:
        """Stop watching and close the pipe (on the loop, or once the loop has stopped)."""
        self._stop_watching()
        if self._fd is not None:
            fd, self._fd, self._key = self._fd, None, None
            os.close(fd)

    def _stop_watching(self) -> None:
        if self._watching and self._fd is not None:
            self._watching = False
            with contextlib.suppress(Exception):  # the loop may be closed already
                self._loop.remove_reader(self._fd)

    def _readable(self) -> None:
        assert self._fd is not None
        pending = array.array("i", [0])
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, pending)
        except OSError:
            pending[0] = 0
        if pending[0] > 0:
            self._stop_watching()  # level-triggered: the byte stays until the coordinator
            self._on_ring()
        else:
            log.info("the coordinator's doorbell closed; waiting for its next hello")
            self.close()


def _key(info: Mapping[str, Any] | None) -> tuple[str, int, int] | None:
    if not isinstance(info, Mapping):
        return None
    path, dev, ino = info.get("path"), info.get("dev"), info.get("ino")
    if not isinstance(path, str) or not isinstance(dev, int) or not isinstance(ino, int):
        return None
    return path, dev, ino


def _open_verified(path: str, dev: int, ino: int) -> int | None:
    """The pipe at ``path`` if it is the coordinator's (same device and inode), else None."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):  # never open anything else here
            raise OSError(0, "not a named pipe")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        log.info("doorbell %s not usable here (%s); the event stream alone tells of drains",
                 path, exc.strerror)
        return None
    st = os.fstat(fd)
    if not stat.S_ISFIFO(st.st_mode) or (st.st_dev, st.st_ino) != (dev, ino):
        os.close(fd)
        log.info("doorbell %s is another file here (another mount namespace?); the event "
                 "stream alone tells of drains", path)
        return None
    return fd
