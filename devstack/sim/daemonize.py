"""Start a daemon the way a misbehaving engine child does: double fork and ``setsid``.

The intermediate process starts a new session, forks the daemon and exits at once, so the
daemon is reparented away (to a subreaper or PID 1) and is in neither its starter's tree, nor
its session, nor its process group: only the unit it was born in (a container's cgroup or
mount namespace) still holds it. The daemon execs ``python -m devstack.sim.daemon`` and
reports ready on a pipe, like every other child, with its PID; its end record is
``<record-dir>/daemon-<pid>.json``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any

from devstack.sim.errors import SimStartupError


def start_daemon(record_dir: str, *, timeout_s: float) -> dict[str, Any]:
    """Start the daemon; returns what it reported (``pid``, ``role``, ``rank``, ``ppid``)."""
    read_fd, write_fd = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        _intermediate(record_dir, read_fd, write_fd)  # never returns
    os.close(write_fd)
    try:
        line = _read_line(read_fd, timeout_s)
    finally:
        os.close(read_fd)
        os.waitpid(intermediate, 0)
    processes: list[dict[str, Any]] = json.loads(line)["processes"]
    return processes[0]


def _intermediate(record_dir: str, read_fd: int, write_fd: int) -> None:
    """In the forked intermediate: new session, fork the daemon, exit without cleanup."""
    try:
        os.close(read_fd)
        os.setsid()
        if os.fork() == 0:
            os.set_inheritable(write_fd, True)
            os.execv(sys.executable, [
                sys.executable, "-m", "devstack.sim.daemon", "--record-dir", record_dir,
                "--parent-pid", "0", "--ready-fd", str(write_fd),
            ])
    finally:
        os._exit(0)


def _read_line(fd: int, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SimStartupError(f"the daemon was not up after {timeout_s}s")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SimStartupError("the daemon exited before it came up")
        data += chunk
    return data
