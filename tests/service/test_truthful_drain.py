"""The drain tells the truth about how the engine ended, held against the processes' own
records: a stubborn child cannot starve the main process, a self-SIGKILLing main process or
lost requests are never ``graceful``, and a drain with nothing to stop says so."""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator import exit_codes
from tests.kill.helpers import alive, start_tree
from tests.service.servers import ROOT, Running, register, start_coordinator
from tests.support.fd_limits import soft_fd_limit
from tests.support.processes import ProcessJanitor, wait_for

SGLANG_SHAPED = {
    "role": "tokenizer-manager",
    "children": [
        {"role": "scheduler", "pdeathsig": True, "teardown": 0.2},
        {"role": "scheduler", "pdeathsig": True, "teardown": 0.2},
        {"role": "scheduler", "pdeathsig": True, "teardown": 0.2},
        {"role": "detokenizer", "pdeathsig": True},
        {"role": "dp-controller", "pdeathsig": True, "children": [
            {"role": "dp-scheduler", "pdeathsig": True, "teardown": 0.2},
            {"role": "dp-scheduler", "pdeathsig": True, "teardown": 0.2},
        ]},
        {"role": "stubborn", "pdeathsig": True, "ignore_term": True},
    ],
}


def get_drain(running: Running) -> dict[str, Any]:
    response = httpx.get(running.url + "/drain", headers=running.headers, timeout=120)
    assert response.status_code == 200, response.text
    summary: dict[str, Any] = response.json()
    return summary


def cli_drain(running: Running) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator", "drain", "--url", running.url, "--reason", "test"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_a_stubborn_child_does_not_starve_the_main_process(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. an SGLang-shaped tree (3 schedulers, a detokenizer, a DP controller with 2
       schedulers, one child that ignores SIGTERM), adopted by PID, with the budget of
       ``--grace-period 12 --safety-margin 2`` and the default 10 s tier timeout;
    2. GET /drain;
    3. the stubborn child was SIGKILLed (no cleanup record, gone);
    4. every other child ran its cleanup (its own record);
    5. the main process got its SIGTERM after its children, ran its cleanup and exited 0
       (its own record and its wait status);
    6. the summary agrees: the main process ``exited`` with 0, the stubborn one ``killed``,
       and the outcome is ``killed``, naming it."""
    tree = start_tree(janitor, SGLANG_SHAPED, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, "--grace-period", "12",
                                "--safety-margin", "2", "--adopt-pid", str(tree.pid))
    summary = get_drain(running)
    (stubborn,) = tree.pids("stubborn")
    markers = tree.markers()
    assert stubborn not in markers
    assert not alive(stubborn)
    assert sorted(markers) == sorted(p for p in tree.pids() if p != stubborn)
    children_ended = max(m["ended_at"] for pid, m in markers.items() if pid != tree.pid)
    assert markers[tree.pid]["signalled_at"] >= children_ended
    assert tree.root.wait(timeout=30) == 0
    processes = {p["pid"]: p for p in summary["processes"]}
    assert sorted(processes) == sorted(tree.pids())
    assert (processes[tree.pid]["fate"], processes[tree.pid]["exit_code"]) == ("exited", 0)
    assert processes[stubborn]["fate"] == "killed"
    assert summary["outcome"] == "killed"
    assert any(str(stubborn) in cause for cause in summary["drain"]["causes"])


def test_a_main_process_that_sigkills_itself_is_not_graceful(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree whose main process, on SIGTERM, cleans up and SIGKILLs itself
       (stock SGLang's ``kill_process_tree(include_parent=True)``);
    2. ``shutdown-coordinator drain``;
    3. the main process did die of SIGKILL (its wait status) after its cleanup (its record);
    4. the summary says exit -9 and the outcome is ``signalled``; ``drain`` exits with
       ``SIGNALLED``."""
    tree = start_tree(janitor, {"sigkill_self": True, "children": [{"role": "child"}]},
                      tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, "--grace-period", "8",
                                "--safety-margin", "1", "--tier-timeout", "3")
    register(running, tree.pid, role="engine")
    result = cli_drain(running)
    assert tree.root.wait(timeout=30) == -9
    assert sorted(tree.markers()) == sorted(tree.pids())
    assert result.returncode == exit_codes.SIGNALLED, result.stdout + result.stderr
    summary = running.status()
    root = next(p for p in summary["processes"] if p["pid"] == tree.pid)
    assert root["exit_code"] == -9
    assert summary["outcome"] == "signalled"


def test_handoffs_no_router_acknowledged_are_lost_requests(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a worker that hands back two requests and reports zero in flight;
       no router acknowledges them;
    2. ``shutdown-coordinator drain`` (a budget whose migration share ends quickly);
    3. the worker process still ended gracefully (its own record), yet the outcome is
       ``lost_requests`` with the count 2 in the summary, and ``drain`` exits with
       ``LOST_REQUESTS``; the metrics count 2 expired migrations."""
    tree = start_tree(janitor, {}, tmp_path / "tree")
    running = start_coordinator(janitor, tmp_path, "--grace-period", "4",
                                "--safety-margin", "1", "--tier-timeout", "2",
                                "--confirm-timeout", "1")
    worker = register(running, tree.pid, role="engine")
    with running.client() as client:
        response = client.post(f"/workers/{worker['id']}/report", json={
            "inflight": 0,
            "handoffs": [{"request_id": "r-1", "tokens": 3}, {"request_id": "r-2", "tokens": 5}],
        })
        assert response.status_code == 200, response.text
    result = cli_drain(running)
    assert tree.root.wait(timeout=30) == 0
    assert sorted(tree.markers()) == [tree.pid]
    assert result.returncode == exit_codes.LOST_REQUESTS, result.stdout + result.stderr
    summary = running.status()
    assert summary["outcome"] == "lost_requests"
    assert summary["drain"]["lost_requests"] == 2
    metrics = httpx.get(running.url + "/metrics", timeout=30).text
    assert 'shutdown_coordinator_migrations_total{event="expired"} 2.0' in metrics


def test_a_drain_with_nothing_to_stop_says_so(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a coordinator with no worker registered and nothing adopted;
    2. ``shutdown-coordinator drain``;
    3. the outcome is ``nothing_to_drain``, ``drain`` exits with ``NOTHING_TO_DRAIN`` and
       warns on stderr, and the coordinator's log warns too."""
    running = start_coordinator(janitor, tmp_path)
    result = cli_drain(running)
    assert result.returncode == exit_codes.NOTHING_TO_DRAIN, result.stdout + result.stderr
    assert "nothing" in result.stderr.lower()
    assert running.status()["outcome"] == "nothing_to_drain"
    assert "nothing_to_drain" in running.log.read_text()


def test_a_drain_holds_with_1100_idle_clients_connected(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start the coordinator with systemd's default soft fd limit (1,024), and register
       a tree of four processes;
    2. hold 1,100 idle connections to it, so every fd it opens from then on (the kill's
       pidfds) is numbered above 1,024;
    3. GET /drain on one more connection;
    4. every process of the tree got SIGTERM, ran its cleanup (its own record) and exited 0,
       and the summary agrees, outcome ``graceful``."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} leaves no room for 1,100 connections")
    tree = start_tree(janitor, {"children": [{"role": "scheduler",
                                              "children": [{"role": "tp-worker"}]},
                                             {"role": "detokenizer"}]}, tmp_path / "tree")
    with soft_fd_limit(1024):
        running = start_coordinator(janitor, tmp_path)
    register(running, tree.pid, role="engine")
    host, port = running.url.removeprefix("http://").rsplit(":", 1)
    with contextlib.ExitStack() as stack:
        for _ in range(1100):
            stack.enter_context(socket.create_connection((host, int(port)), timeout=30))
        # Every connection accepted: the coordinator holds an fd for each.
        wait_for(lambda: len(list(Path(f"/proc/{running.proc.pid}/fd").iterdir())) > 1100,
                 what="the coordinator to accept 1,100 connections")
        summary = get_drain(running)
    assert sorted(tree.markers()) == sorted(tree.pids())
    assert tree.root.wait(timeout=30) == 0
    processes = {p["pid"]: p for p in summary["processes"]}
    assert sorted(processes) == sorted(tree.pids())
    assert all((p["fate"], p["exit_code"]) == ("exited", 0) for p in processes.values()), \
        processes
    assert summary["outcome"] == "graceful"
