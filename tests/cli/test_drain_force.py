"""``shutdown-coordinator drain --force`` against a real coordinator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coordinator import exit_codes
from tests.kill.helpers import start_tree
from tests.service.servers import FAST, ROOT, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for


def test_drain_force_kills_the_tree_and_exits_with_the_killed_code(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree whose processes would all run their cleanup and exit on SIGTERM;
    2. run `drain --force --json`;
    3. it exits with the `killed` code; no process ran its cleanup (none wrote its record),
       nothing runs, the root died of SIGKILL (its wait status); the printed summary agrees:
       force, every process killed with -9, outcome killed."""
    tree = start_tree(janitor, {"children": [{"children": [{}]}]}, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", tree.pattern)
    wait_for(lambda: len(running.status()["processes"]) == len(tree.pids()), what="scan")
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "drain", "--force", "--json", "--url", running.url],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == exit_codes.OUTCOME_CODES["killed"], done.stderr
    summary = json.loads(done.stdout)
    root_code = tree.root.wait(timeout=30)
    assert root_code == -9
    assert tree.markers() == {}
    truth = assert_summary_is_true(summary, tree, root_code=root_code)
    assert {e.fate for e in truth.values()} == {"killed"}
    assert summary["last_drain"]["force"] is True
    assert {p["exit_code"] for p in summary["processes"]} == {-9}
