"""A registered engine that crashes while its drain runs: the summary must still say what
happened to each of its processes, held against /proc, the main process's wait status and
the processes' own records (tests/kill/trees.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from tests.kill.helpers import alive, start_tree
from tests.service.servers import FAST, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


def test_an_engine_that_crashes_mid_drain_is_reported(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree (its children die with it through PDEATHSIG); the drain stays in
       draining for 5 s (``--min-drain``);
    2. POST /drain without waiting, then SIGKILL the main process: it crashes while the
       drain is still draining (/status says so), before any kill;
    3. GET /drain: the summary lists every process of the tree once, none still runs
       (/proc), the main process ``gone`` with the -9 of its wait status, none ran its
       cleanup (no record); the outcome is ``signalled`` and names the main process."""
    tree = start_tree(janitor, {"role": "engine", "children": [
        {"role": "scheduler", "pdeathsig": True}, {"role": "detokenizer", "pdeathsig": True},
    ]}, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, *FAST, "--min-drain", "5")
    register(running, tree.pid, role="engine")
    wait_for(lambda: len(running.status()["processes"]) == len(tree.pids()), what="scan")
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    os.kill(tree.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in tree.pids()), what="the tree's end")
    assert running.status()["phase"] == "draining"
    response = httpx.get(running.url + "/drain", timeout=120)
    assert response.status_code == 200, response.text
    summary = response.json()
    assert tree.markers() == {}
    assert sorted(p["pid"] for p in summary["processes"]) == sorted(tree.pids())
    root = next(p for p in summary["processes"] if p["pid"] == tree.pid)
    assert (root["fate"], root["exit_code"]) == ("gone", tree.root.wait(timeout=30))
    assert {p["fate"] for p in summary["processes"]} == {"gone"}
    assert summary["outcome"] == "signalled"
    assert any(str(tree.pid) in cause for cause in summary["drain"]["causes"])
