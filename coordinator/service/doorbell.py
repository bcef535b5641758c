"""The doorbell: one named pipe whose first byte wakes every worker of the pod at once.

The drain line on each worker's event stream is one write per worker. With 16 workers on 2
CPUs the first workers woken preempt the coordinator before it has written to the last ones,
and those then wait their turn on the run queue behind everything the first ones do next:
that is most of the drain notice's tail (docs/benchmarks.md). A FIFO lets one ``write`` make
every reader readable inside the same system call, so no worker waits for the coordinator to
get the CPU back.

Readers (``worker_client``) open the pipe read-only and only watch it: nobody reads the byte,
so it stays readable for all until the coordinator takes it back when a drain is aborted. The
coordinator holds the pipe open read-write for its whole life, so a reader sees end-of-file
(readable with nothing to read) exactly when the coordinator is gone. The pipe's device and
inode are told to the workers with the path, so a worker in another mount namespace, where
the path may name another file or nothing, does not use it. The stream's ``drain`` line is
still sent: it carries the drain's details and covers workers that cannot open the pipe.

Mode ``0644``: any local user may listen, only the coordinator's user may ring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = "off"
AUTO_PREFIX = "shutdown-coordinator-doorbell-"
_AUTO_NAME = re.compile(re.escape(AUTO_PREFIX) + r"(\d+)$")
MODE = 0o644


@dataclass(frozen=True)
class DoorbellInfo:
    """What a worker needs to find the pipe and to be sure it found the right one."""

    path: str
    dev: int
    ino: int

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "dev": self.dev, "ino": self.ino}


def auto_dir() -> Path:
    """Where ``auto`` puts the pipe: ``$XDG_RUNTIME_DIR`` when usable, else the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        return Path(runtime)
    try:
        return Path(tempfile.gettempdir())
    except FileNotFoundError:
        # No writable temp directory at all (a read-only root filesystem and no /tmp
        # volume): the pipe cannot be made there, which ``open`` reports, and the
        # coordinator serves without a doorbell instead of failing to start.
        return Path("/tmp")


def sweep_stale(directory: Path) -> int:
    """Remove ``auto`` pipes left by coordinators that died without cleaning up (SIGKILL);
    returns how many."""
    removed = 0
    try:
        entries = list(directory.iterdir())
    except OSError:
        return 0
    for entry in entries:
        match = _AUTO_NAME.match(entry.name)
        if match is None:
            continue
        import psutil  # here: a start with no other coordinator's pipe beside it needs none

        if psutil.pid_exists(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(entry.lstat().st_mode):
                entry.unlink()
                removed += 1
    return removed


class Doorbell:
    """The coordinator's end of the pipe. ``ring`` at a drain's start, ``reset`` when it is
    aborted; neither blocks nor raises."""

    def __init__(self, path: Path, *, sweep: bool = False) -> None:
        self.path = path
        self._sweep = sweep
        """``auto``: remove the pipes of dead coordinators beside it when opening."""
        self._fd: int | None = None
        self._rung = False
        self.info: DoorbellInfo | None = None

    @classmethod
    def from_setting(cls, value: str) -> Doorbell | None:
        """``off``: none; ``auto``: a pipe per coordinator process in the runtime or temp
        directory; anything else: that path."""
        if value == OFF:
            return None
        if value == AUTO:
            return cls(auto_dir() / f"{AUTO_PREFIX}{os.getpid()}", sweep=True)
        return cls(Path(value))

    def open(self) -> DoorbellInfo:
        """Create the pipe (replacing an earlier coordinator's) and hold it open.

        Raises ``OSError`` when the path cannot be made a pipe (something else is there,
        no permission); the coordinator then runs without a doorbell."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._sweep:
            sweep_stale(self.path.parent)
        try:
            existing = self.path.lstat()
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISFIFO(existing.st_mode):
                raise FileExistsError(f"{self.path} exists and is not a named pipe")
            # A pipe left by an earlier coordinator: its listeners keep the old inode, see
            # end-of-file (its writer is gone) and take this one from their next hello.
            self.path.unlink()
        os.mkfifo(self.path, MODE)
        # Never through a link put in its place since (in a directory others can write):
        # opened without following one, checked to be a pipe, its mode set through the fd.
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode):
            os.close(fd)
            raise FileExistsError(f"{self.path} was replaced by something else than a pipe")
        os.fchmod(fd, MODE)  # whatever the umask
        self._fd = fd
        self.info = DoorbellInfo(str(self.path), st.st_dev, st.st_ino)
        log.info("doorbell at %s", self.path)
        return self.info

    def ring(self) -> None:
        """Wake every listener (once per drain), then yield the CPU to them."""
        if self._fd is None or self._rung:
            return
        try:
            os.write(self._fd, b"!")
            self._rung = True
        except OSError as exc:  # never in the drain's way: the stream's line still goes
            log.warning("doorbell not rung: %s", exc)
            return
        # Step back: the workers just woken go before the rest of the drain's start (the
        # stream lines, the answer, the state file). Returns at once when no one waits for
        # this CPU; with more engines than CPUs it let the last engine's notice come
        # earlier (docs/benchmarks.md).
        os.sched_yield()

    def reset(self) -> None:
        """Take the byte back (the drain was aborted): listeners may wait again."""
        if self._fd is None or not self._rung:
            return
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 512):
                pass
        self._rung = False

    def close(self) -> None:
        """Listeners see end-of-file; the path is removed if it is still this pipe."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        info = self.info
        with contextlib.suppress(OSError):
            st = self.path.lstat()
            if info is not None and (st.st_dev, st.st_ino) == (info.dev, info.ino):
                self.path.unlink()
        os.close(fd)
