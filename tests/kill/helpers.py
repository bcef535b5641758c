"""Start the test trees of tests/kill/trees.py and read what they recorded."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.processes import ProcessJanitor, wait_for

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Tree:
    """A running test tree."""

    root: subprocess.Popen[Any]
    record_dir: Path
    processes: list[dict[str, Any]]
    """``{"pid", "role", "depth"}`` of every process, root first."""
    handles: dict[int, psutil.Process] = field(default_factory=dict)
    """Each process as it was at the start: signalling through it can never hit a process
    that reused the PID since (psutil checks the start time)."""

    @property
    def pid(self) -> int:
        return self.root.pid

    def pids(self, role: str | None = None) -> list[int]:
        return [int(p["pid"]) for p in self.processes if role is None or p["role"] == role]

    @property
    def pattern(self) -> str:
        """A command-line regex that matches this tree's processes and no other's (for
        ``--adopt-pattern`` and ``kill --pattern``): every node names its record directory."""
        return rf"tests\.kill\.trees .* {re.escape(str(self.record_dir))}( |$)"

    def markers(self, prefix: str = "") -> dict[int, dict[str, Any]]:
        """Records written by processes that finished their cleanup, by PID."""
        out: dict[int, dict[str, Any]] = {}
        for path in self.record_dir.glob(f"{prefix}*-*.json"):
            data = json.loads(path.read_text())
            out[int(data["pid"])] = data
        return out


    def end(self, timeout: float = 30.0) -> None:
        """End whatever of the tree still runs, deepest first, as a graceful kill would
        (SIGTERM; SIGKILL for a node that ignores it), and reap the root: for a test that
        leaves its tree untouched until its end."""
        for depth in sorted({int(p["depth"]) for p in self.processes}, reverse=True):
            procs = [self.handles[int(p["pid"])] for p in self.processes
                     if int(p["depth"]) == depth and alive(int(p["pid"]))]
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.send_signal(signal.SIGKILL if _ignores_sigterm(proc.pid)
                                     else signal.SIGTERM)
            _, left = psutil.wait_procs(procs, timeout=timeout)
            assert not [p for p in left if alive(p.pid)], f"still running: {left}"
        self.root.wait(timeout=timeout)


def _ignores_sigterm(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in text.splitlines()
                if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def start_tree(janitor: ProcessJanitor, spec: dict[str, Any], record_dir: Path) -> Tree:
    """Start a tree (in its own session) and wait until every process of it is up."""
    record_dir.mkdir(parents=True, exist_ok=True)
    root = janitor.spawn_python(
        ["-m", "tests.kill.trees", json.dumps(spec), str(record_dir)], cwd=REPO
    )
    ready = record_dir / "ready.json"
    wait_for(ready.exists, timeout=60, what="the test tree to start")
    processes: list[dict[str, Any]] = json.loads(ready.read_text())
    handles = {int(p["pid"]): psutil.Process(int(p["pid"])) for p in processes}
    return Tree(root, record_dir, processes, handles)


def start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
