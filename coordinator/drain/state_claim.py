"""A state file is one coordinator's, and nobody else's to write: checked, and locked, before
the coordinator reads it or listens.

A state file names processes to signal; whoever can write it, or replace it, chooses what a
restarted coordinator kills. ``claim(path)``, as steps:

    1. the file's directory is made (mode 0700) when missing;
    2. like OpenSSH's ``StrictModes``, the directory and the file (when present) must be
       owned by the coordinator's user or root and writable by no other (no group or
       world write bit), and the file must be a regular file, not a symbolic link;
       otherwise ``StateFileUnsafe``, naming what to fix;
    3. ``<path>.lock`` (made 0600, never followed through a link, held to the same rules)
       is locked with ``flock(LOCK_EX)``: a second coordinator on the same file waits up to
       ``LOCK_WAIT_S`` (a restart racing the old process's exit), then ``StateFileLocked``,
       naming the holder's PID. The lock lives as long as the process (the kernel releases
       it at any exit, SIGKILL included); the lock file is never removed (removing it would
       let two processes each lock a different file).

A path that cannot be used at all (its directory is a file, a read-only filesystem) is no
refusal: the coordinator serves without a lock (``Claim.problem`` says why) and shows its
failing writes, as a state file never traps it; it only refuses what someone else holds or
could write.

Both refusals are ``StateFileRefused`` (an ``OSError``); ``serve`` exits with the named codes
``STATE_FILE_LOCKED`` and ``STATE_FILE_UNSAFE``. Without them, two coordinators ran the same
kill (a process got SIGTERM twice, two summaries disagreed), and a file in a world-writable
directory, owned by another user, was trusted and its processes signalled.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_WAIT_S = 2.0
LOCK_POLL_S = 0.05
UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


class StateFileRefused(OSError):
    """The state file cannot be used: base of the two below."""


class StateFileUnsafe(StateFileRefused):
    """Another user could write or replace the state file."""


class StateFileLocked(StateFileRefused):
    """Another coordinator holds the state file."""


@dataclass
class Claim:
    """The held lock of one state file (kept open for the life of the process)."""

    path: Path
    fd: int | None
    problem: str | None = None
    """Why the file is not locked (its path cannot be used); None when it is."""

    def release(self) -> None:
        """Unlock (only for a coordinator that stops and lives on, as in tests)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def claim(path: Path, *, wait_s: float = LOCK_WAIT_S) -> Claim:
    """Check ``path`` and lock it for this process (see the module docstring)."""
    # Step 1.
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = path.parent.resolve()
        info = os.stat(directory)
    except OSError as exc:
        return Claim(path, None, f"its directory cannot be used ({exc.strerror or exc})")
    if not stat.S_ISDIR(info.st_mode):
        return Claim(path, None, "its directory is not a directory")
    # Step 2.
    check_owner(directory, info, "the state file's directory")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(info.st_mode):
            raise StateFileUnsafe(f"--state-file {path} is a symbolic link: whoever made it "
                                  "chooses the file read; remove it (the coordinator writes "
                                  "a regular file there)")
        if stat.S_ISREG(info.st_mode):
            check_owner(path, info, "the state file")
    # Step 3.
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateFileUnsafe(f"{lock} is a symbolic link: remove it") from exc
        return Claim(path, None, f"{lock} cannot be made ({exc.strerror or exc})")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateFileUnsafe(f"{lock} is not a regular file: remove it")
        check_owner(lock, info, "the state file's lock")
        _lock(fd, lock, wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return Claim(path, fd)


def check_owner(path: Path, info: os.stat_result, what: str) -> None:
    """``StateFileUnsafe`` unless ``path`` (whose ``stat`` is ``info``) is owned by us or
    root and writable by no other user."""
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        raise StateFileUnsafe(
            f"{what} {path} belongs to UID {info.st_uid}, not to this coordinator's UID {me} "
            "or root: that user could choose the processes a restart signals; give it to "
            f"UID {me} (chown), or use a directory of the coordinator's own")
    if info.st_mode & UNSAFE_BITS:
        who = "every user" if info.st_mode & stat.S_IWOTH else "its group"
        raise StateFileUnsafe(
            f"{what} {path} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o}): "
            "another user could replace the state file and choose the processes a restart "
            "signals; chmod go-w it, or use a directory of the coordinator's own (a "
            "subdirectory it creates is 0700)")


def _lock(fd: int, lock: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                raise StateFileLocked(
                    f"another coordinator (pid {holder}) holds {lock}: two coordinators on "
                    "one state file would run the same kill twice; stop it, or give this "
                    "one its own --state-file") from None
            time.sleep(LOCK_POLL_S)
