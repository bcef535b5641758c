"""Kill tiers for adopted trees (``--adopt-tier``), with real processes.

The summary is held against what really happened: each process records who sent it SIGTERM
and when (tests/service/named_tree.py), the root records the exit code it saw for each
child, the root's own code is the test's wait status, and /proc shows nothing left running.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from coordinator.kill import pidfd
from tests.kill.helpers import alive
from tests.service.named_tree import NamedTree, child_marker, start_named_tree
from tests.service.servers import FAST, Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


def drain(janitor: ProcessJanitor, tmp_path: Path, names: list[str], *tier_flags: str,
          ) -> tuple[NamedTree, Running, dict[str, Any], dict[str, dict[str, Any]]]:
    """Adopt a named tree with ``tier_flags``, GET /drain; the tree, the coordinator, the
    summary and its entries by name (``root`` and each child)."""
    tag = f"tiers-{uuid.uuid4().hex[:8]}"
    tree = start_named_tree(janitor, tmp_path, tag, names)
    flags = [arg for flag in tier_flags for arg in ("--adopt-tier", flag)]
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", f"--tag {tag}",
                                *flags)
    wait_for(lambda: len(running.status()["processes"]) == len(names) + 1, what="scan")
    with running.client() as client:
        summary: dict[str, Any] = client.get("/drain").json()
    by_pid = {p["pid"]: p for p in summary["processes"]}
    return tree, running, summary, {name: by_pid[pid] for name, pid in
                                    [("root", tree.pid), *tree.children.items()]}


def assert_true_to_the_tree(tree: NamedTree, summary: dict[str, Any],
                            ) -> dict[str, dict[str, Any]]:
    """Every process of the tree is listed once (and nothing else), none runs, each got
    SIGTERM (its record), each exit code is what its parent (or the test) saw, every fate is
    ``exited`` and the outcome graceful; returns the records by name."""
    pids = sorted(p["pid"] for p in summary["processes"])
    assert pids == sorted([tree.pid, *tree.children.values()])
    assert not [pid for pid in pids if alive(pid)]
    records = tree.records()
    assert sorted(records) == pids
    by_name = {"root": records[tree.pid],
               **{name: records[pid] for name, pid in tree.children.items()}}
    seen = {name: c["exit_code"] for name, c in by_name["root"]["children"].items()}
    assert seen == dict.fromkeys(tree.children, -15)  # SIGTERM's default action
    codes = {tree.pid: tree.root.wait(timeout=30)} | {
        tree.children[name]: code for name, code in seen.items()}
    assert codes[tree.pid] == 0
    listed = {p["pid"]: p["exit_code"] for p in summary["processes"]}
    if not pidfd.support().exit_info:
        # Without PIDFD_INFO_EXIT a child its parent reaped at once has no code to read.
        listed = {pid: codes[pid] if code is None and pid != tree.pid else code
                  for pid, code in listed.items()}
    assert listed == codes
    assert {p["fate"] for p in summary["processes"]} == {"exited"}
    assert summary["counts"]["exited"] == len(pids)
    assert summary["outcome"] == "graceful"
    return by_name


def test_adopted_children_end_in_the_declared_tier_order(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree outside the coordinator with children alpha, beta, gamma;
    2. start the coordinator adopting it, with tiers gamma then alpha (beta in none);
    3. GET /drain;
    4. the processes' records: the coordinator sent each its SIGTERM, gamma first, then
       alpha, then beta, the root last; the summary agrees with them and with the exit
       codes seen (children -15, the root 0): gamma ended before alpha was signalled, alpha
       before beta (default order), and the root last, each in its tier."""
    tree, running, summary, procs = drain(
        janitor, tmp_path, ["alpha", "beta", "gamma"],
        f"gamma={child_marker('gamma')}:5", f"alpha={child_marker('alpha')}:5")
    records = assert_true_to_the_tree(tree, summary)
    assert {r["sender"] for r in records.values()} == {running.proc.pid}
    order = ["gamma", "alpha", "beta", "root"]
    assert sorted(order, key=lambda n: records[n]["signalled_at"]) == order
    assert [procs[n]["tier"] for n in order] == ["gamma", "alpha", "depth-1", "roots"]
    assert {p["signal"] for p in procs.values()} == {"SIGTERM"}
    assert procs["gamma"]["ended_at"] <= procs["alpha"]["signalled_at"]
    assert procs["alpha"]["ended_at"] <= procs["beta"]["signalled_at"]
    assert procs["beta"]["ended_at"] <= procs["root"]["signalled_at"]


def test_a_root_tier_signals_the_adopted_root_first(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree whose root stops its own children on SIGTERM;
    2. start the coordinator adopting it with a tier that holds the root (``:root``);
    3. GET /drain;
    4. the records: the coordinator signalled only the root, the root signalled its
       children; the summary agrees: the root in tier ``main`` exited 0, its children
       exited (-15) by its doing before it exited, never signalled by the coordinator."""
    tree, running, summary, procs = drain(janitor, tmp_path, ["alpha", "beta"],
                                          "main=named_tree:5:SIGTERM:root")
    records = assert_true_to_the_tree(tree, summary)
    assert records.pop("root")["sender"] == running.proc.pid
    assert {r["sender"] for r in records.values()} == {tree.pid}
    root = procs.pop("root")
    assert (root["tier"], root["signal"], root["fate"], root["exit_code"]) == (
        "main", "SIGTERM", "exited", 0)
    assert len(procs) == 2
    for child in procs.values():
        assert child["signalled_at"] is None
        assert child["killed_at"] is None
        assert child["ended_at"] is None or child["ended_at"] <= root["ended_at"]
