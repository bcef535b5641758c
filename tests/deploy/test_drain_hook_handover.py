"""The preStop hook with ``--main-by-kubelet``: it returns before the engine's main process is
signalled, and the main process's SIGTERM is the one the kubelet sends after it.

The test plays the kubelet: it runs the real hook, waits for it to return, and only then
sends the tree's root its SIGTERM (or, in the second test, never does). What each process
received, and when, is read from the processes' own records and wait statuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from coordinator import exit_codes
from coordinator.drain.handover import LEFT_TO_CALLER
from tests.deploy.rendering import DRAIN_HOOK
from tests.kill.helpers import Tree, alive, start_tree
from tests.service.servers import FAST, Running, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

SPEC: dict[str, Any] = {"role": "root", "children": [
    {"role": "scheduler", "children": [{"role": "leaf"}]}, {"role": "detok"}]}


def run_hook(janitor: ProcessJanitor, running: Running) -> subprocess.Popen[str]:
    return janitor.spawn([sys.executable, str(DRAIN_HOOK), "--url", running.url,
                          "--main-by-kubelet"], stdout=subprocess.PIPE, text=True)


def final_summary(running: Running) -> dict[str, Any]:
    """The drain's summary once it is done (a plain ``GET /drain`` joins it)."""
    with running.client(timeout=120) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    return summary


def others_ended(tree: Tree) -> set[int]:
    return {pid for pid in tree.pids() if pid != tree.pid and pid in tree.markers()}


def test_the_hook_returns_before_the_main_process_and_the_kubelets_sigterm_ends_it(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree (root → scheduler → leaf, root → detok), killed deepest first, root last;
    2. the hook with ``--main-by-kubelet`` returns 0 naming the root, once every other process
       ended after its cleanup, while the root runs and has received nothing (no record);
    3. the test, as the kubelet, SIGTERMs the root: it cleans up and exits 0;
    4. the summary is true: graceful, the root ``exited`` 0 with SIGTERM, the caller named."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, SPEC, tmp_path / "tree")
    register(running, tree.pid)
    hook = run_hook(janitor, running)
    out, _ = hook.communicate(timeout=120)

    assert hook.returncode == exit_codes.OK, out
    assert f"main left to the kubelet's SIGTERM: {tree.pid}(python" in out
    assert "so far=graceful" in out
    assert "not graceful" not in out
    assert others_ended(tree) == set(tree.pids()) - {tree.pid}
    assert alive(tree.pid)
    assert tree.pid not in tree.markers()  # no SIGTERM reached it yet
    status = running.status()
    assert status["phase"] == "terminating"
    assert status["main_handover"]["handed"] == [tree.pid]

    os.kill(tree.pid, signal.SIGTERM)  # the kubelet's, once the hook returned
    summary = final_summary(running)
    assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=60),
                           outcome="graceful")
    root = next(p for p in summary["processes"] if p["pid"] == tree.pid)
    assert (root["fate"], root["exit_code"], root["signal"]) == ("exited", 0, "SIGTERM")
    assert root["detail"] == LEFT_TO_CALLER


def test_a_main_process_the_caller_never_signals_is_sigkilled_and_the_summary_says_whose(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. as above, but the kubelet's SIGTERM never comes (a shell that does not pass it on);
    2. at its tier's end the root is SIGKILLed (its wait status), with no record of a SIGTERM;
    3. the summary says ``killed`` and that its signal was left to the caller."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, SPEC, tmp_path / "tree")
    register(running, tree.pid)
    hook = run_hook(janitor, running)
    out, _ = hook.communicate(timeout=120)
    assert hook.returncode == exit_codes.OK, out

    summary = final_summary(running)
    assert tree.root.wait(timeout=60) == -signal.SIGKILL
    assert tree.pid not in tree.markers()
    assert_summary_is_true(summary, tree, root_code=-signal.SIGKILL, outcome="killed")
    root = next(p for p in summary["processes"] if p["pid"] == tree.pid)
    assert root["fate"] == "killed"
    assert "left to the caller of the drain, which may not have sent it" in root["detail"]


def test_a_hook_that_goes_away_before_the_main_process_takes_nothing_over(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. the root reports one request in flight, so the drain holds in migrating; 2. the
    hook waits (``/status`` counts it), then is SIGKILLed; the coordinator counts it gone;
    3. the request finishes: the coordinator SIGTERMs the root itself (its own record), and
    everything ends graceful."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, SPEC, tmp_path / "tree")
    worker_id = register(running, tree.pid)["id"]
    with running.client() as client:
        assert client.post(f"/workers/{worker_id}/report", json={"inflight": 1}).is_success
    hook = run_hook(janitor, running)
    wait_for(lambda: running.status()["main_handover"]["waiting"] == 1 or None,
             what="the hook waiting for the main process")
    hook.kill()
    hook.wait(timeout=30)
    wait_for(lambda: running.status()["main_handover"]["waiting"] == 0 or None,
             what="the coordinator seeing the hook gone")
    assert running.status()["phase"] == "migrating"
    with running.client() as client:
        assert client.post(f"/workers/{worker_id}/report", json={"inflight": 0}).is_success

    summary = final_summary(running)
    assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=60),
                           outcome="graceful")
    assert tree.pid in tree.markers()  # the coordinator's SIGTERM, cleanup done
    assert summary["main_handover"]["handed"] is None
    root = next(p for p in summary["processes"] if p["pid"] == tree.pid)
    assert root["detail"] != LEFT_TO_CALLER


def test_the_hooks_exit_code_reports_what_went_wrong_before_the_handover(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a child that ignores SIGTERM (SIGKILLed at its tier's end) under the root; 2. the
    hook returns at the handover with exit 3 (``killed``), naming the child, its own wait
    status -9; 3. the root, SIGTERMed by the test, exits 0; the final outcome is ``killed``."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, {"role": "root", "children": [
        {"role": "stubborn", "ignore_term": True}]}, tmp_path / "tree")
    register(running, tree.pid)
    hook = run_hook(janitor, running)
    out, _ = hook.communicate(timeout=120)
    stubborn = tree.pids("stubborn")[0]
    assert hook.returncode == exit_codes.KILLED, out
    assert "so far=killed" in out
    assert f"not graceful: {stubborn}(python" in out
    assert not alive(stubborn)
    assert alive(tree.pid)
    os.kill(tree.pid, signal.SIGTERM)
    summary = final_summary(running)
    root_code = tree.root.wait(timeout=60)
    assert root_code == 0
    assert tree.markers()[tree.pid]["reaped"] == {str(stubborn): -signal.SIGKILL}
    assert_summary_is_true(summary, tree, root_code=root_code, outcome="killed")


def test_without_the_flag_the_hook_waits_for_the_whole_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """The plain hook (the coordinator container's, in the classic-sidecar component) still
    returns only at the end, its root stopped by the coordinator."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, SPEC, tmp_path / "tree")
    register(running, tree.pid)
    hook = janitor.spawn([sys.executable, str(DRAIN_HOOK), "--url", running.url],
                         stdout=subprocess.PIPE, text=True)
    out, _ = hook.communicate(timeout=120)
    assert hook.returncode == exit_codes.OK, out
    assert "outcome=graceful" in out
    assert tree.root.wait(timeout=60) == 0
    assert tree.pid in tree.markers()
    status = httpx.get(running.url + "/status").json()
    assert status["main_handover"] == {"waiting": 0, "handed": None}
