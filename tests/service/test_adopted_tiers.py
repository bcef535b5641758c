"""Kill tiers for adopted trees (``--adopt-tier``), with real processes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.service.named_tree import child_marker, start_named_tree
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


def drain(janitor: ProcessJanitor, tmp_path: Path, names: list[str],
          *tier_flags: str) -> tuple[dict[str, Any], dict[str, Any]]:
    tag = f"tiers-{uuid.uuid4().hex[:8]}"
    tree = start_named_tree(janitor, tmp_path, tag, names)
    flags = [arg for flag in tier_flags for arg in ("--adopt-tier", flag)]
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", f"--tag {tag}",
                                *flags)
    wait_for(lambda: len(running.status()["processes"]) == len(names) + 1, what="scan")
    with running.client() as client:
        summary: dict[str, Any] = client.get("/drain").json()
    by_pid = {p["pid"]: p for p in summary["processes"]}
    return tree, {name: by_pid[pid] for name, pid in
                  [("root", tree["pid"]), *tree["children"].items()]}


def test_adopted_children_end_in_the_declared_tier_order(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree outside the coordinator with children alpha, beta, gamma;
    2. start the coordinator adopting it, with tiers gamma then alpha (beta in none);
    3. GET /drain;
    4. gamma ended before alpha was signalled, alpha before beta (default order), and the
       root last, each in its tier, every one exited after SIGTERM, the root exit 0."""
    _, procs = drain(janitor, tmp_path, ["alpha", "beta", "gamma"],
                     f"gamma={child_marker('gamma')}:5", f"alpha={child_marker('alpha')}:5")
    assert [procs[n]["tier"] for n in ("gamma", "alpha", "beta", "root")] == [
        "gamma", "alpha", "depth-1", "roots"]
    assert {p["fate"] for p in procs.values()} == {"exited"}
    assert {p["signal"] for p in procs.values()} == {"SIGTERM"}
    assert procs["gamma"]["ended_at"] <= procs["alpha"]["signalled_at"]
    assert procs["alpha"]["ended_at"] <= procs["beta"]["signalled_at"]
    assert procs["beta"]["ended_at"] <= procs["root"]["signalled_at"]
    assert procs["root"]["exit_code"] == 0


def test_a_root_tier_signals_the_adopted_root_first(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree whose root stops its own children on SIGTERM;
    2. start the coordinator adopting it with a tier that holds the root (``:root``);
    3. GET /drain;
    4. only the root was signalled (tier ``main``, exit 0); its children ended by its own
       doing before it exited, and the coordinator never signalled them."""
    _, procs = drain(janitor, tmp_path, ["alpha", "beta"], "main=named_tree:5:SIGTERM:root")
    root = procs.pop("root")
    assert (root["tier"], root["signal"], root["fate"], root["exit_code"]) == (
        "main", "SIGTERM", "exited", 0)
    for child in procs.values():
        assert child["fate"] in ("exited", "gone")
        assert child["signalled_at"] is None
        assert child["killed_at"] is None
        assert child["ended_at"] is None or child["ended_at"] <= root["ended_at"]
