"""Start the test trees of tests/kill/trees.py and read what they recorded."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
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


def start_tree(janitor: ProcessJanitor, spec: dict[str, Any], record_dir: Path) -> Tree:
    """Start a tree (in its own session) and wait until every process of it is up."""
    record_dir.mkdir(parents=True, exist_ok=True)
    root = janitor.spawn_python(
        ["-m", "tests.kill.trees", json.dumps(spec), str(record_dir)], cwd=REPO
    )
    ready = record_dir / "ready.json"
    wait_for(ready.exists, timeout=60, what="the test tree to start")
    return Tree(root, record_dir, json.loads(ready.read_text()))


def start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
