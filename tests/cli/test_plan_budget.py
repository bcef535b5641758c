"""``status --plan`` says what the drain's budget gives each tier before its SIGKILL, not
only the tier's configured timeout, and a budget shorter than one tier is warned of, at
``serve``'s start and in the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.kill.tiers import planned_waits
from tests.kill.helpers import start_tree
from tests.service.servers import ROOT, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

COMMAND = [sys.executable, "-m", "coordinator"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize(("stubborn", "expected"), [(True, [2.0, 2.0, 4.0]),
                                                    (False, [2.0, 4.0, 8.0])])
def test_the_waits_follow_the_kill_engines_rules(stubborn: bool, expected: list[float]) -> None:
    """The README's example: a 10 s kill, three 10 s tiers, 2 s of SIGKILL confirmation
    (usable 8 s, the last tier keeps 4 s): every tier before stubborn, each gets its fair
    share and the last its reserve; every tier before quick, each later one gets more."""
    waits = planned_waits([10.0, 10.0, 10.0], deadline_s=10.0, confirm_s=2.0,
                          stubborn=stubborn)
    assert waits == pytest.approx(expected)


def test_a_budget_shorter_than_one_tier_is_warned_of_and_the_plan_shows_what_it_gives(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``serve --grace-period 5.5 --safety-margin 5`` (a 1 s budget, 10 s tiers) adopting
       a tree whose child ignores SIGTERM: the start-up log warns, naming both flags.
    2. ``status --plan`` warns too, and shows each tier's SIGKILL coming within the budget,
       not after its 10 s timeout: the JSON's least and most waits are at most 1 s.
    3. The drain: no tier waited longer than the plan's most (the coordinator's own
       ``kill_at``), and what it reports is true (the child needed SIGKILL)."""
    tree = start_tree(janitor, {"role": "root", "children": [
        {"role": "stubborn", "ignore_term": True}]}, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, "--grace-period", "5.5",
                                "--safety-margin", "5", "--adopt-pattern", tree.pattern,
                                "--scan-interval", "0.5", "--log-level", "info")
    log = wait_for(lambda: "listening" in running.log.read_text() and running.log.read_text(),
                   what="the start-up log")
    warning = ("--grace-period 5.5 --safety-margin 5: the drain's budget is 1s (0.25s to "
               "migrate, 0.75s to terminate), shorter than one kill tier's timeout (10s)")
    assert warning in log

    def planned() -> dict[str, object] | None:
        plan = json.loads(run("status", "--plan", "--json", "--url", running.url).stdout)
        return plan if plan["processes"] == len(tree.pids()) else None

    plan = wait_for(planned, what="the tree in the plan")
    tiers = plan["tiers"]
    assert isinstance(tiers, list)
    for tier in tiers:
        assert tier["timeout_s"] == 10.0
        assert 0 < tier["wait_s"]["least"] <= tier["wait_s"]["most"] <= 1.0
    text = run("status", "--plan", "--url", running.url).stdout
    assert "warning: the drain's budget is 1s" in text
    assert "SIGKILL after" in text
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    most = {p["pid"]: t["wait_s"]["most"] for t in tiers for p in t["processes"]}
    for process in summary["processes"]:
        if process.get("kill_at") and process.get("signalled_at"):
            assert process["kill_at"] - process["signalled_at"] <= most[process["pid"]] + 0.01
    truth = assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    assert truth[tree.pids("stubborn")[0]].fate == "killed"
