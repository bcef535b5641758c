"""A drain started by mistake on a coordinator with nothing to drain does not keep the pod
out of rotation for good: ``DELETE /drain`` (``drain --abort``) ends its cycle. A drain that
terminated processes still cannot be undone (409: the contract's abort ends at
``terminating``)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from coordinator import exit_codes
from tests.kill.helpers import start_tree
from tests.service.servers import FAST, ROOT, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

COMMAND = [sys.executable, "-m", "coordinator"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def readyz(url: str) -> int:
    return httpx.get(url + "/readyz", timeout=30).status_code


def test_a_drain_with_nothing_to_drain_is_undone_by_the_abort_it_advises(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``drain`` on a coordinator where nothing registered: exit 14; it warns that the
       pod stays out of rotation and names the command that puts it back; /readyz 503.
    2. That command, run as printed: exit 0, serving again; /readyz 200; the drain is kept
       as ``last_drain``; the metrics count the cycle's end as ``dismissed``.
    3. The next drain starts as any would (a new drain, not the old one joined)."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    drained = run("drain", "--url", running.url, "--quiet")
    assert drained.returncode == exit_codes.NOTHING_TO_DRAIN
    assert readyz(running.url) == 503
    advised = re.search(r"`(shutdown-coordinator drain --abort[^`]*)`", drained.stderr)
    assert advised, drained.stderr
    assert "stays out of rotation (/readyz 503)" in drained.stderr
    command = shlex.split(advised.group(1))
    undone = run(*command[1:])
    assert undone.returncode == exit_codes.OK, undone.stderr
    assert undone.stdout.startswith("the drain had nothing to drain: the coordinator is "
                                    "serving again"), undone.stdout
    assert readyz(running.url) == 200
    status = running.status()
    assert (status["phase"], status["drain"]) == ("serving", None)
    assert status["last_drain"]["outcome"] == "nothing_to_drain"
    metrics = httpx.get(running.url + "/metrics", timeout=30).text
    assert 'shutdown_coordinator_new_cycles_total{trigger="dismissed"} 1.0' in metrics
    again = run("drain", "--url", running.url, "--quiet", "--json")
    assert again.returncode == exit_codes.NOTHING_TO_DRAIN
    assert '"generation"' in again.stdout
    assert readyz(running.url) == 503


def test_a_drain_that_terminated_processes_cannot_be_undone(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A registered tree, drained to ``done`` (gracefully, as its records say).
    2. ``DELETE /drain``: 409, naming why; ``drain --abort`` exits 8; readiness stays 503."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, {"role": "root", "children": [{"role": "child"}]},
                      tmp_path / "tree")
    register(running, tree.pid)
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    with running.client() as client:
        refused = client.delete("/drain")
    assert refused.status_code == 409
    assert "the drain is done and processes were terminated" in refused.json()["detail"]
    aborted = run("drain", "--abort", "--url", running.url)
    assert aborted.returncode == exit_codes.REFUSED
    assert "HTTP 409" in aborted.stderr
    assert wait_for(lambda: running.status()["phase"] == "done", what="still done")
    assert readyz(running.url) == 503
