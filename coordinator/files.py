"""Every file the coordinator writes is replaced whole, never written through a link someone
else planted.

``replace_file(path, data)``, as steps:

    1. a temporary file is created next to ``path`` (same directory, so the rename stays on
       one filesystem), under a random name, with ``O_CREAT | O_EXCL | O_NOFOLLOW``: a name
       that already exists (a symlink or file planted for it, even dangling) is never
       opened, another random name is tried;
    2. the data is written through that descriptor (and fsynced when ``durable``);
    3. the temporary is renamed over ``path``: a reader sees the old file or the new one,
       never half of one; a symlink at ``path`` is replaced, not followed;
    4. when ``durable``, the directory is fsynced, so the rename survives a crash.

A predictable temporary (``.NAME.<pid>.tmp``) let a local user who planted symlinks for the
next PIDs in a shared directory have a root-owned file overwritten with content it partly
chose.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

ATTEMPTS = 32
"""Random names tried before giving up (each planted one costs an attacker a guess of 64
random bits: only a test that chooses the names can make more than one fail)."""
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def random_name(target: str) -> str:
    """A temporary's name for ``target``: hidden, with 64 random bits."""
    return f".{target}.{secrets.token_hex(8)}.tmp"


def replace_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                 durable: bool = False,
                 name: Callable[[str], str] = random_name) -> None:
    """Replace ``path`` with ``data`` (see the module docstring); ``mode`` is the new file's
    permissions (less the umask)."""
    target = Path(path)
    fd, temporary = _create(target, mode, name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if durable:
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _create(target: Path, mode: int, name: Callable[[str], str]) -> tuple[int, Path]:
    """Step 1: a new file next to ``target``, opened for writing; its descriptor and path."""
    for _ in range(ATTEMPTS):
        temporary = target.with_name(name(target.name))
        try:
            return os.open(temporary, FLAGS, mode), temporary
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {target} after {ATTEMPTS} tries")
