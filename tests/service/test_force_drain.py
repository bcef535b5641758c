"""Force drains (``POST /drain {"force": true}``), from serving and joining a graceful drain."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.service.servers import FAST, Running, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


def adopted(janitor: ProcessJanitor, tmp_path: Path, *flags: str,
            stubborn: int = 1) -> tuple[dict[str, Any], Running]:
    tag = f"force-{uuid.uuid4().hex[:8]}"
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1, stubborn=stubborn,
                      tag=tag)
    running = start_coordinator(janitor, tmp_path, *flags, "--adopt-pattern", f"--tag {tag}")
    wait_for(lambda: len(running.status()["processes"]) == len(tree["all"]), what="scan")
    return tree, running


def post_drain(running: Running, **body: Any) -> httpx.Response:
    with running.client() as client:
        return client.post("/drain", json=body)


def test_force_drain_sigkills_everything_without_migrating(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree (one child ignores SIGTERM);
    2. POST /drain {"force": true} and wait for the summary;
    3. every process was SIGKILLed, none got a graceful signal; the timeline still passes
       through every phase; the drain says force, its outcome is killed."""
    tree, running = adopted(janitor, tmp_path, *FAST)
    summary = post_drain(running, force=True, reason="operator").json()
    assert (summary["phase"], summary["outcome"]) == ("done", "killed")
    assert summary["last_drain"]["force"] is True
    assert [t["phase"] for t in summary["timeline"]][-4:] == [
        "draining", "migrating", "terminating", "done"]
    assert sorted(p["pid"] for p in summary["processes"]) == sorted(tree["all"])
    for process in summary["processes"]:
        assert process["fate"] in ("killed", "gone")
        assert process["signal"] is None
    assert any(p["fate"] == "killed" and p["killed_at"] for p in summary["processes"])


def test_force_joining_a_migrating_drain_ends_the_wait_and_kills(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree; the coordinator holds every drain in draining (long --min-drain);
    2. POST /drain without waiting: graceful drain, phase draining;
    3. POST /drain {"force": true}: it joins, and the drain goes on to the force kill;
    4. the summary: force, outcome killed, every process SIGKILLed in the force tier."""
    tree, running = adopted(janitor, tmp_path, *FAST, "--min-drain", "3600")
    started = post_drain(running, wait=False)
    assert started.status_code == 202
    assert started.json()["drain"]["force"] is False
    summary = post_drain(running, force=True).json()
    assert (summary["phase"], summary["outcome"]) == ("done", "killed")
    assert summary["last_drain"]["force"] is True
    assert {p["tier"] for p in summary["processes"]} <= {"force"}
    assert sorted(p["pid"] for p in summary["processes"]) == sorted(tree["all"])


def test_force_joining_the_graceful_kill_escalates_it(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree with a child that ignores SIGTERM; tiers wait 60 s before SIGKILL;
    2. POST /drain without waiting; follow /status until that child got SIGTERM;
    3. POST /drain {"force": true};
    4. the child is SIGKILLed in its tier with the force-mode reason (not after 60 s);
       the drain says force, its outcome is killed."""
    tree, running = adopted(janitor, tmp_path, "--grace-period", "300", "--tier-timeout", "60",
                            "--confirm-timeout", "1", "--prekill-timeout", "1")
    stubborn = tree["children"][-1]
    post_drain(running, wait=False)

    def signalled() -> bool:
        entry = next(p for p in running.status()["processes"] if p["pid"] == stubborn)
        return bool(entry["signal"] == "SIGTERM")

    wait_for(signalled, what="the stubborn child got SIGTERM")
    summary = post_drain(running, force=True).json()
    assert (summary["phase"], summary["outcome"]) == ("done", "killed")
    entry = next(p for p in summary["processes"] if p["pid"] == stubborn)
    assert (entry["fate"], entry["signal"]) == ("killed", "SIGTERM")
    assert "force mode" in entry["detail"]
    assert entry["signalled_at"] <= entry["killed_at"] <= entry["ended_at"]
    assert summary["last_drain"]["force"] is True
