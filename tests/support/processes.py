"""Start real processes in tests and make sure every one of them ends.

Each process is started in its own session (so a whole tree can be found again through its
process group and session even after its parent died) and remembered; ``ProcessJanitor.close``
SIGTERMs what is left, waits on events (psutil's wait uses pidfd/waitpid, no fixed sleep),
and SIGKILLs every process of every session it started. Nothing outside those sessions is ever
signalled, and only by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

TERM_GRACE_S = 5.0


class ProcessJanitor:
    """Owns every process a test starts; ``close()`` leaves none behind."""

    def __init__(self) -> None:
        self._popens: list[subprocess.Popen[Any]] = []
        self._sessions: set[int] = set()
        self._extra: list[psutil.Process] = []

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        stdout: Any = None,
        stderr: Any = None,
        new_session: bool = True,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` (in a new session by default) and track it."""
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        proc = subprocess.Popen(
            list(argv),
            env=full_env,
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
        )
        self._popens.append(proc)
        if new_session:
            self._sessions.add(proc.pid)
        return proc

    def spawn_python(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return self.spawn([sys.executable, *args], **kwargs)

    def adopt(self, pid: int) -> None:
        """Track a process started by something else (e.g. a daemonised child)."""
        with contextlib.suppress(psutil.NoSuchProcess):
            self._extra.append(psutil.Process(pid))

    def leftovers(self) -> list[psutil.Process]:
        """Live processes this janitor is responsible for (its sessions and their trees)."""
        found: dict[int, psutil.Process] = {}
        for proc in self._popens:
            try:
                root = psutil.Process(proc.pid)
                found[root.pid] = root
                for child in root.children(recursive=True):
                    found[child.pid] = child
            except psutil.NoSuchProcess:
                pass
        me = os.getpid()
        if self._sessions:
            for p in psutil.process_iter(["pid"]):
                if p.pid == me:
                    continue
                try:
                    if os.getsid(p.pid) in self._sessions:
                        found.setdefault(p.pid, p)
                except (ProcessLookupError, PermissionError, OSError):
                    pass
        for p in self._extra:
            if p.is_running():
                found.setdefault(p.pid, p)
        return [p for p in found.values() if p.pid not in (me, 1)]

    def close(self) -> None:
        """SIGTERM what is left, wait up to a bound, SIGKILL the rest; reap our children."""
        left = self.leftovers()
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(left, timeout=TERM_GRACE_S)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=TERM_GRACE_S)
        # A second sweep catches processes forked while we were terminating.
        for p in self.leftovers():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for proc in self._popens:
            try:
                proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.01,
) -> Any:
    """Return the first truthy value of ``predicate()``; fail with ``what`` after ``timeout``.

    This is the one place tests wait for something that offers no event to block on (a file
    written by another process, a port being bound). The timeout only bounds failure; a
    passing test never waits for it.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def iter_tree(pid: int) -> Iterator[psutil.Process]:
    """The process and its live descendants."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    yield root
    try:
        yield from root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
