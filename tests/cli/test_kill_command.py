"""``shutdown-coordinator kill``: the ordered kill from the command line, no service."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from coordinator import exit_codes
from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _tree(janitor: ProcessJanitor, tmp: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    records = tmp / "records"
    records.mkdir()
    janitor.spawn_python(["-m", "tests.kill.trees", json.dumps(spec), str(records)], cwd=ROOT)
    ready = records / "ready.json"
    wait_for(ready.exists, what="the tree to be up")
    nodes: list[dict[str, Any]] = json.loads(ready.read_text())
    return nodes


def _kill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", "kill", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_kill_by_pattern_is_graceful(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a root with two children that run a short cleanup on SIGTERM.
    2. `kill --pattern` with a regex naming this test's record directory, `--json`.
    3. Exit 0; every process `exited` with code 0, the children before the root."""
    nodes = _tree(janitor, tmp_path, {"role": "root", "teardown": 0.1, "children": [
        {"role": "a", "teardown": 0.1, "pdeathsig": True},
        {"role": "b", "teardown": 0.1, "pdeathsig": True}]})
    root = next(n["pid"] for n in nodes if n["role"] == "root")
    done = _kill("--pattern", f"tests.kill.trees .*{tmp_path.name}", "--json")
    assert done.returncode == exit_codes.OK, done.stderr
    report = json.loads(done.stdout)
    fates = {p["pid"]: p for p in report["processes"]}
    assert {n["pid"] for n in nodes} <= set(fates)
    assert all(p["fate"] == "exited" for p in fates.values()), fates
    assert fates[root]["exit_code"] == 0
    children = [fates[n["pid"]] for n in nodes if n["pid"] != root]
    assert all(c["ended_at"] <= fates[root]["signalled_at"] for c in children)


def test_kill_reports_sigkill_with_its_exit_code(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a root whose child ignores SIGTERM.
    2. `kill ROOT --tier-timeout 0.5`.
    3. Exit code KILLED; the table names the child `killed`."""
    nodes = _tree(janitor, tmp_path, {"role": "root", "children": [
        {"role": "stubborn", "ignore_term": True}]})
    root = next(n["pid"] for n in nodes if n["role"] == "root")
    done = _kill(str(root), "--tier-timeout", "0.5", "--deadline", "20")
    assert done.returncode == exit_codes.KILLED, done.stdout + done.stderr
    assert "killed" in done.stdout


def test_force_and_refusals(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. `kill 1` is refused (exit REFUSED) and `kill` with nothing to kill is a usage error.
    2. `kill ROOT --force` SIGKILLs the whole tree at once: exit KILLED."""
    refused = _kill("1")
    assert refused.returncode == exit_codes.REFUSED
    assert "nothing was signalled" in refused.stderr
    assert _kill().returncode == exit_codes.USAGE
    nodes = _tree(janitor, tmp_path, {"role": "root", "children": [{"role": "c"}]})
    root = next(n["pid"] for n in nodes if n["role"] == "root")
    forced = _kill(str(root), "--force", "--json")
    assert forced.returncode == exit_codes.KILLED, forced.stderr
    report = json.loads(forced.stdout)
    assert report["mode"] == "force"
    assert {p["fate"] for p in report["processes"]} == {"killed"}
