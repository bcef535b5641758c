"""How every command ends when it is cut short: by Ctrl-C (SIGINT), or by its reader going
away (``| head``). One rule for all of them, applied by ``entry.main``:

- **SIGINT**: the command stops where it is and prints one line on stderr, ``interrupted:``
  and what goes on without it (a drain goes on in the coordinator; a kill stops where it
  was) with how to stop or abort that, then exits ``INTERRUPTED`` (130, a shell's 128 +
  SIGINT). No traceback. Each command says its own line (``interrupted(args)``).
- **A closed pipe**: what the command would still write to that stream is dropped, and it
  ends with the exit code of its outcome, as if its output had been read, so ``drain --quiet
  | head -1`` under ``pipefail`` still fails on ``killed``. A command that would only go on
  printing (``status --watch``) asks ``reader_gone()`` and stops.

Python ignores SIGPIPE, so a write to a pipe nobody reads raises ``BrokenPipeError``; the
standard streams are wrapped here so that it never reaches the command.

The commands that wait on the coordinator over HTTP (``drain``, ``status``) end at the
signal itself (``interrupt_ends_at_once``), not by a ``KeyboardInterrupt`` raised wherever
the main thread was: httpx's connection pool is not safe against an exception between a
lock's acquire and its ``with`` block, and a Ctrl-C landing there left the pool's lock held,
so the client's close at the way out waited for it forever (``status --watch`` hung after
Ctrl-C, every time under coverage's tracer, which widens that window).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO

from coordinator import exit_codes


class _ReaderTolerant:
    """A standard stream whose writes stop, silently, once its reader went away."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        """What is still buffered, and whatever comes, goes to /dev/null from now on: the
        interpreter's own flush at exit must not fail (it would exit 120) either."""
        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def tolerant_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` that drop what their reader no longer reads, for
    the time of a command; flushed before they are given back, so a closed pipe is seen
    here and not at the interpreter's exit."""
    saved = sys.stdout, sys.stderr
    out, err = _ReaderTolerant(sys.stdout), _ReaderTolerant(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved


def reader_gone() -> bool:
    """Whether the reader of the standard output went away (nobody reads what comes)."""
    return bool(getattr(sys.stdout, "reader_gone", False))


def interrupted(what_goes_on: str) -> int:
    """Say on stderr that the command was interrupted and ``what_goes_on`` (one line);
    returns ``INTERRUPTED``."""
    # On a terminal the shell echoed ^C where the cursor was: start a line of our own.
    fresh = "\r\x1b[K" if sys.stderr.isatty() else ""
    print(f"{fresh}interrupted: {what_goes_on}", file=sys.stderr, flush=True)
    return exit_codes.INTERRUPTED


def interrupt_ends_at_once(what_goes_on: Callable[[], str]) -> None:
    """From now on Ctrl-C (SIGINT) ends this process at the signal: what was written to
    stdout is flushed, the ``interrupted:`` line (``what_goes_on()``) written straight to
    stderr's descriptor, and the process exits ``INTERRUPTED`` without unwinding (no lock
    of a library is waited for on the way out). Left as it is when SIGINT is ignored (a
    background job) or already handled by someone else."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):  # the main thread may be inside a write
            sys.stdout.flush()
        fresh = "\r\x1b[K" if sys.stderr.isatty() else ""
        with contextlib.suppress(OSError):
            os.write(2, f"{fresh}interrupted: {what_goes_on()}\n".encode())
        os._exit(exit_codes.INTERRUPTED)

    signal.signal(signal.SIGINT, on_sigint)
