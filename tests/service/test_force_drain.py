"""Force drains (``POST /drain {"force": true}``), from serving and joining a graceful drain.

Each summary is held against what really happened (tests/service/truth.py): the processes'
own records (a SIGTERM runs a cleanup that writes one), the exit codes their parents and the
test saw, and /proc.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.kill.helpers import Tree, start_tree
from tests.service.servers import FAST, Running, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

TREE = {"role": "root", "children": [
    {"role": "child", "children": [{"role": "grandchild"}]},
    {"role": "stubborn", "ignore_term": True},
]}
"""A root, a child with a grandchild, and a child that ignores SIGTERM."""


def adopted(janitor: ProcessJanitor, tmp_path: Path, *flags: str) -> tuple[Tree, Running]:
    tree = start_tree(janitor, TREE, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, *flags, "--adopt-pattern", tree.pattern)
    wait_for(lambda: len(running.status()["processes"]) == len(tree.pids()), what="scan")
    return tree, running


def post_drain(running: Running, **body: Any) -> httpx.Response:
    with running.client() as client:
        return client.post("/drain", json=body)


def test_force_drain_sigkills_everything_without_migrating(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree (one child ignores SIGTERM);
    2. POST /drain {"force": true} and wait for the summary;
    3. no process ran its cleanup (none wrote a record: none got SIGTERM), nothing runs,
       the root died of SIGKILL (its wait status); the summary agrees (every process
       killed, none with a graceful signal, exit code -9); the timeline still passes
       through every phase; the drain says force, its outcome is killed."""
    tree, running = adopted(janitor, tmp_path, *FAST)
    summary = post_drain(running, force=True, reason="operator").json()
    assert summary["phase"] == "done"
    root_code = tree.root.wait(timeout=30)
    assert root_code == -9
    assert tree.markers() == {}
    truth = assert_summary_is_true(summary, tree, root_code=root_code, outcome="killed")
    assert {e.fate for e in truth.values()} == {"killed"}
    assert summary["last_drain"]["force"] is True
    assert [t["phase"] for t in summary["timeline"]][-4:] == [
        "draining", "migrating", "terminating", "done"]
    for process in summary["processes"]:
        assert (process["signal"], process["tier"]) == (None, "force"), process
        assert process["killed_at"] is not None, process


def test_force_joining_a_migrating_drain_ends_the_wait_and_kills(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree; the coordinator holds every drain in draining (long --min-drain);
    2. POST /drain without waiting: graceful drain, phase draining;
    3. POST /drain {"force": true}: it joins, and the drain goes on to the force kill;
    4. no process ran its cleanup, nothing runs, the root died of SIGKILL; the summary
       agrees: force, outcome killed, every process SIGKILLed in the force tier."""
    tree, running = adopted(janitor, tmp_path, *FAST, "--min-drain", "3600")
    started = post_drain(running, wait=False)
    assert started.status_code == 202
    assert started.json()["drain"]["force"] is False
    summary = post_drain(running, force=True).json()
    root_code = tree.root.wait(timeout=30)
    assert root_code == -9
    assert tree.markers() == {}
    assert_summary_is_true(summary, tree, root_code=root_code, outcome="killed")
    assert summary["phase"] == "done"
    assert summary["last_drain"]["force"] is True
    assert [p["tier"] for p in summary["processes"]] == ["force"] * len(tree.pids())


def test_force_joining_the_graceful_kill_escalates_it(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree with a child that ignores SIGTERM; tiers wait 60 s before SIGKILL;
    2. POST /drain without waiting; wait until the stubborn child's tier was signalled
       (its sibling's own cleanup record) and /status says the stubborn child got SIGTERM;
    3. POST /drain {"force": true};
    4. the grandchild and the sibling ran their cleanup; the stubborn child and the root
       did not, and the root died of SIGKILL; the summary agrees, the stubborn child is
       SIGKILLed in its tier with the force-mode reason (not after 60 s); the drain says
       force, its outcome is killed."""
    tree, running = adopted(janitor, tmp_path, "--grace-period", "300", "--tier-timeout", "60",
                            "--confirm-timeout", "1", "--prekill-timeout", "1")
    (stubborn,) = tree.pids("stubborn")
    (sibling,) = tree.pids("child")
    post_drain(running, wait=False)

    def signalled() -> bool:
        entry = next(p for p in running.status()["processes"] if p["pid"] == stubborn)
        return sibling in tree.markers() and entry["signal"] == "SIGTERM"

    wait_for(signalled, what="the stubborn child's tier got SIGTERM")
    summary = post_drain(running, force=True).json()
    root_code = tree.root.wait(timeout=30)
    assert root_code == -9
    truth = assert_summary_is_true(summary, tree, root_code=root_code, outcome="killed")
    assert sorted(pid for pid, e in truth.items() if e.cleanup) == sorted(
        [sibling, *tree.pids("grandchild")])
    entry = next(p for p in summary["processes"] if p["pid"] == stubborn)
    assert (entry["fate"], entry["signal"], entry["exit_code"]) == ("killed", "SIGTERM", -9)
    assert "force mode" in entry["detail"]
    assert entry["signalled_at"] <= entry["killed_at"] <= entry["ended_at"]
    assert summary["last_drain"]["force"] is True
