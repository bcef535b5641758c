"""``shutdown-coordinator kill``: the ordered kill from the command line, no service.

What the command reports is held against what happened (tests/service/truth.py): each
process's own cleanup record, the exit codes its parent and the test saw, and /proc.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from coordinator import exit_codes
from tests.kill.helpers import Tree, start_tree
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor

ROOT = Path(__file__).resolve().parents[2]


def _kill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", "kill", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def _judged(report: dict[str, Any]) -> dict[str, Any]:
    """A kill report in the shape the truth check reads (its ``graceful`` as the outcome)."""
    return {"processes": report["processes"],
            "outcome": "graceful" if report["graceful"] else "killed"}


def _table_rows(tree: Tree, table: str) -> dict[int, tuple[str, str]]:
    """``(FATE, EXIT)`` of each row of the printed table, by PID."""
    rows: dict[int, tuple[str, str]] = {}
    for line in table.splitlines():
        words = line.split()
        if words and words[0].isdigit() and sys.executable in words:
            rows[int(words[0])] = (words[2], words[words.index(sys.executable) - 1])
    return rows


def test_kill_by_pattern_is_graceful(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a root with two children that run a short cleanup on SIGTERM.
    2. `kill --pattern` with a regex naming this test's record directory, `--json`.
    3. Exit 0; the report lists exactly the tree's processes, every one `exited` with code 0,
       the children before the root; so it was: each ran its cleanup (its record), their
       parent saw them exit 0, the root's wait status is 0, nothing runs."""
    tree = start_tree(janitor, {"role": "root", "teardown": 0.1, "children": [
        {"role": "a", "teardown": 0.1, "pdeathsig": True},
        {"role": "b", "teardown": 0.1, "pdeathsig": True}]}, tmp_path / "tree")
    done = _kill("--pattern", tree.pattern, "--json")
    assert done.returncode == exit_codes.OK, done.stderr
    report = json.loads(done.stdout)
    truth = assert_summary_is_true(_judged(report), tree, root_code=tree.root.wait(timeout=30))
    assert {(e.fate, e.exit_code) for e in truth.values()} == {("exited", 0)}
    fates = {p["pid"]: p for p in report["processes"]}
    children = [fates[pid] for pid in tree.pids() if pid != tree.pid]
    assert len(children) == 2
    assert all(c["ended_at"] <= fates[tree.pid]["signalled_at"] for c in children)
    markers = tree.markers()
    assert all(markers[pid]["ended_at"] <= markers[tree.pid]["signalled_at"]
               for pid in tree.pids("a") + tree.pids("b"))


def test_kill_reports_sigkill_with_its_exit_code(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a root whose child ignores SIGTERM.
    2. `kill ROOT --tier-timeout 0.5`.
    3. Exit code KILLED; the table has one row per process: the child `killed` with exit
       code -9, the root `exited` with 0; so it was: the child ran no cleanup and its parent
       saw it die of SIGKILL, the root ran its cleanup and its wait status is 0."""
    tree = start_tree(janitor, {"role": "root", "children": [
        {"role": "stubborn", "ignore_term": True}]}, tmp_path / "tree")
    (stubborn,) = tree.pids("stubborn")
    done = _kill(str(tree.pid), "--tier-timeout", "0.5", "--deadline", "20")
    assert done.returncode == exit_codes.KILLED, done.stdout + done.stderr
    assert _table_rows(tree, done.stdout) == {stubborn: ("killed", "-9"), tree.pid: ("exited", "0")}
    assert tree.root.wait(timeout=30) == 0
    markers = tree.markers()
    assert sorted(markers) == [tree.pid]
    assert markers[tree.pid]["reaped"] == {str(stubborn): -9}


def test_force_and_refusals(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. `kill 1` is refused (exit REFUSED) and `kill` with nothing to kill is a usage error.
    2. `kill ROOT --force` SIGKILLs the whole tree at once: exit KILLED, every process
       `killed`; so it was: none ran its cleanup, the root died of SIGKILL, nothing runs."""
    refused = _kill("1")
    assert refused.returncode == exit_codes.REFUSED
    assert "nothing was signalled" in refused.stderr
    assert _kill().returncode == exit_codes.USAGE
    tree = start_tree(janitor, {"role": "root", "children": [{"role": "c"}]}, tmp_path / "tree")
    forced = _kill(str(tree.pid), "--force", "--json")
    assert forced.returncode == exit_codes.KILLED, forced.stderr
    report = json.loads(forced.stdout)
    assert report["mode"] == "force"
    root_code = tree.root.wait(timeout=30)
    assert root_code == -9
    assert tree.markers() == {}
    truth = assert_summary_is_true(_judged(report), tree, root_code=root_code)
    assert {e.fate for e in truth.values()} == {"killed"}
