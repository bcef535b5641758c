"""Starting children as ``python -m devstack.sim.<role>`` and waiting until they are up.

Each child gets the write end of one shared pipe (``--ready-fd``) and writes a single JSON
line there once it is up: ``{"processes": [{"pid", "role", "rank", "ppid"}, ...]}`` — itself
first, then any processes of its own (the DP controller's schedulers). Lines are shorter than
``PIPE_BUF``, so children writing at once never interleave.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from devstack.sim.errors import SimStartupError


@dataclass(frozen=True)
class ChildSpec:
    """One child to start: the module under ``devstack.sim`` and its arguments."""

    module: str
    args: tuple[str, ...] = ()


@dataclass
class StartedChild:
    """A started child and the processes it reported when it came up."""

    popen: subprocess.Popen[bytes]
    module: str
    processes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def role(self) -> str:
        return str(self.processes[0]["role"]) if self.processes else self.module


def spawn_children(specs: list[ChildSpec], *, timeout_s: float) -> list[StartedChild]:
    """Start every child (from the calling thread) and wait until each one reports it is up.

    Children arm PDEATHSIG against the thread that forked them, so this must run on a thread
    that lives as long as the process: the main thread.
    """
    read_fd, write_fd = os.pipe()
    started: list[StartedChild] = []
    try:
        for spec in specs:
            argv = [
                sys.executable,
                "-m",
                f"devstack.sim.{spec.module}",
                *spec.args,
                "--parent-pid",
                str(os.getpid()),
                "--ready-fd",
                str(write_fd),
            ]
            popen = subprocess.Popen(argv, pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
            started.append(StartedChild(popen=popen, module=spec.module))
    finally:
        os.close(write_fd)
    try:
        _read_ready_lines(read_fd, started, timeout_s)
    except BaseException:
        for child in started:
            child.popen.kill()
            child.popen.wait()
        raise
    finally:
        os.close(read_fd)
    return started


def _read_ready_lines(read_fd: int, started: list[StartedChild], timeout_s: float) -> None:
    by_pid = {child.pid: child for child in started}
    waiting = set(by_pid)
    buffer = b""
    deadline = time.monotonic() + timeout_s
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SimStartupError(f"children {sorted(waiting)} not up after {timeout_s}s")
        readable, _, _ = select.select([read_fd], [], [], left)
        if not readable:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            raise SimStartupError(f"children {sorted(waiting)} exited before coming up")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            report = json.loads(line)
            processes = report["processes"]
            pid = int(processes[0]["pid"])
            if pid in by_pid:
                by_pid[pid].processes = processes
                waiting.discard(pid)


def report_ready(ready_fd: int, processes: list[dict[str, Any]]) -> None:
    """Tell the parent this child is up (and which processes it brought with it)."""
    line = json.dumps({"processes": processes}).encode() + b"\n"
    try:
        os.write(ready_fd, line)
    finally:
        os.close(ready_fd)
