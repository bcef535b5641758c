"""The soft file descriptor limit, changed for the span of a block and restored after it."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def soft_fd_limit(limit: int) -> Iterator[None]:
    """This process's soft ``RLIMIT_NOFILE`` is ``limit`` inside (processes started there
    inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def no_fd_left() -> Iterator[None]:
    """No ``open()`` can succeed inside. The limit caps fd numbers, not their count: at the
    lowest free number nothing below it is free, whatever holes the run left above it."""
    lowest_free = os.dup(0)
    os.close(lowest_free)
    with soft_fd_limit(lowest_free):
        yield


@contextlib.contextmanager
def fd_room(count: int) -> Iterator[None]:
    """Room for ``count`` more fds inside (the soft limit raised if need be, up to hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(os.listdir("/proc/self/fd")) + count + 64
    with soft_fd_limit(max(soft, min(wanted, hard))):
        yield
