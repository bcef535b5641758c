"""A subreaper that does not reap until told: ``python -m tests.service.zombie_keeper DIR``.

It starts a worker (a new session) and becomes the parent of whatever that worker leaves
behind, but reaps nothing until its own SIGTERM: what dies under it stays a zombie, as under a
slow init. The worker writes ``DIR/worker.pid``; on SIGUSR1 it starts a child that dies with
it (``PR_SET_PDEATHSIG`` SIGKILL), which writes ``DIR/child.pid`` once that is armed; the
worker waits to be killed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def write(path: Path, text: str) -> None:
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)


def worker(directory: Path) -> None:
    os.setsid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    write(directory / "worker.pid", str(os.getpid()))
    signal.sigwait({signal.SIGUSR1})
    parent = os.getpid()
    if os.fork() == 0:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the death signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
        # Written by the child once its death signal is armed: the test kills the worker
        # only then, or a child still on its way to prctl would outlive it.
        write(directory / "child.pid", str(os.getpid()))
        while True:
            time.sleep(60)
    while True:
        time.sleep(60)


def main(directory: Path) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if os.fork() == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        worker(directory)
    signal.sigwait({signal.SIGTERM})
    while True:  # reap everything at last
        try:
            os.wait()
        except ChildProcessError:
            break
    sys.exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
