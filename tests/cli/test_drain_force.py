"""``shutdown-coordinator drain --force`` against a real coordinator."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from coordinator import exit_codes
from tests.service.servers import FAST, ROOT, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


def test_drain_force_kills_the_tree_and_exits_with_the_killed_code(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. adopt a tree whose processes would all exit on SIGTERM;
    2. run `drain --force --json`;
    3. it exits with the `killed` code; the summary says force, every process SIGKILLed."""
    tag = f"cli-force-{uuid.uuid4().hex[:8]}"
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1, tag=tag)
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", f"--tag {tag}")
    wait_for(lambda: len(running.status()["processes"]) == len(tree["all"]), what="scan")
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "drain", "--force", "--json", "--url", running.url],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == exit_codes.OUTCOME_CODES["killed"], done.stderr
    summary = json.loads(done.stdout)
    assert summary["last_drain"]["force"] is True
    assert {p["fate"] for p in summary["processes"]} <= {"killed", "gone"}
