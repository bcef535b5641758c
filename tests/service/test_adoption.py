"""Adoption of a tree that never registers, by command-line pattern."""

from __future__ import annotations

import uuid
from pathlib import Path

import psutil

from tests.service.servers import FAST, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


def test_a_tree_started_outside_is_adopted_by_pattern_and_drained(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree outside the coordinator, its root's command line carrying a unique tag;
    2. start the coordinator with --adopt-pattern matching the tag;
    3. /status lists the adopted root and its processes (fate running);
    4. GET /drain ends every process of the tree, each listed once with a final fate."""
    tag = f"adopt-me-{uuid.uuid4().hex[:8]}"
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=1, tag=tag)
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", f"--tag {tag}")
    status = wait_for(lambda: (s := running.status())["processes"] and s, what="scan")
    assert [a["pid"] for a in status["adopted"]] == [tree["pid"]]
    assert sorted(p["pid"] for p in status["processes"]) == sorted(tree["all"])
    assert {p["fate"] for p in status["processes"]} == {"running"}
    with running.client() as client:
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    assert sorted(p["pid"] for p in summary["processes"]) == sorted(tree["all"])
    assert {p["fate"] for p in summary["processes"]} <= {"exited", "gone"}
    root = next(p for p in summary["processes"] if p["pid"] == tree["pid"])
    assert root["exit_code"] == 0
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in tree["all"])
