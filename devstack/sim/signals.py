"""Signal handling of the simulated engine's children: the handler only records.

The handler appends the signal number to a list; ``signal.set_wakeup_fd`` makes the kernel
side of the delivery also write a byte to a pipe, so a loop blocked in ``select`` wakes up
without a race between checking the list and going to sleep. The loop then decides what
the signal means (begin cleanup, note and ignore it, ...).
"""

from __future__ import annotations

import os
import select
import signal
from types import FrameType


class SignalLatch:
    """Records the given signals and wakes a ``wait`` that is in progress."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._received: list[int] = []
        self._taken = 0
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in signals:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signum)

    def take(self) -> list[int]:
        """Signals received since the last call, oldest first."""
        new = self._received[self._taken :]
        self._taken += len(new)
        return new

    def wait(self, fds: tuple[int, ...] = (), timeout_s: float | None = None) -> list[int]:
        """Block until a signal arrives, one of ``fds`` is readable, or the timeout passes.

        Returns the readable ``fds`` (signals are read with ``take``).
        """
        if self._taken < len(self._received):
            return []
        readable, _, _ = select.select([self._read_fd, *fds], [], [], timeout_s)
        if self._read_fd in readable:
            self._drain()
        return [fd for fd in readable if fd != self._read_fd]

    def _drain(self) -> None:
        try:
            while os.read(self._read_fd, 512):
                pass
        except BlockingIOError:
            pass


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGINT from here on: the exit code is decided. Python puts the
    default action back for every signal it handled when it shuts down, so a SIGTERM then (a
    coordinator's, sent just as the process leaves on its own) would end it by the signal
    instead of with its code. An ignored signal is left alone (and masking it would not do:
    the client's threads could still take it)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
