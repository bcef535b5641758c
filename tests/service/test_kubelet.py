"""The kubelet's view: ``preStop`` ``httpGet`` on ``/drain`` with a token header, readiness,
SIGTERM after the hook."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.kill.helpers import start_tree
from tests.service.servers import FAST, Running, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "s3cret-token"


def _get_drain(running: Running) -> httpx.Response:
    return httpx.get(running.url + "/drain", headers=running.headers, timeout=60)


def test_prestop_get_blocks_until_done_and_a_second_call_joins(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a coordinator with a token and register a tree (root, 2 children, 2
       grandchildren);
    2. send GET /drain with the Authorization header, as the kubelet's httpGet does;
    3. /readyz answers 503 while the first call is still blocked;
    4. send a second GET /drain: it joins the same drain;
    5. both answer 200 with phase done and the same processes, and that is what happened:
       every process of the tree (and no other) listed once, each ran its cleanup (its own
       record) with the exit code its parent or the test saw, none of them is left (/proc),
       the outcome graceful;
    6. SIGTERM the coordinator: it exits 0 at once."""
    running = start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)
    tree = start_tree(janitor, {"children": [{"children": [{}]}, {"children": [{}]}]},
                      tmp_path / "tree")
    register(running, tree.pid, role="engine")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_get_drain, running)
        wait_for(lambda: httpx.get(running.url + "/readyz").status_code == 503,
                 what="readiness to fail")
        second = pool.submit(_get_drain, running)
        answers = [first.result(), second.result()]
    for answer in answers:
        assert answer.status_code == 200, answer.text
    summaries: list[dict[str, Any]] = [a.json() for a in answers]
    assert [s["phase"] for s in summaries] == ["done", "done"]
    assert summaries[0]["drain"]["started_at"] == summaries[1]["drain"]["started_at"]
    assert summaries[0]["processes"] == summaries[1]["processes"]
    truth = assert_summary_is_true(summaries[0], tree, root_code=tree.root.wait(timeout=30),
                                   outcome="graceful")
    assert {(e.fate, e.exit_code) for e in truth.values()} == {("exited", 0)}
    again = _get_drain(running)
    assert again.json()["processes"] == summaries[0]["processes"]
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=30) == 0


def test_sigterm_during_a_drain_lets_it_finish_then_exits_0(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree whose one child ignores SIGTERM, with a state file;
    2. POST /drain wait=false and SIGTERM the coordinator at once;
    3. the coordinator keeps going: the drain reaches done;
    4. then it exits 0, and the state file says done: the stubborn child (that pid, and no
       other) killed, every other process exited, outcome killed; and so it was: the
       stubborn child alone ran no cleanup and its parent saw it die of SIGKILL, the others
       ran theirs, nothing runs, the root exited 0 (its wait status)."""
    state = tmp_path / "state.json"
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state))
    tree = start_tree(janitor, {"children": [{"children": [{}]},
                                             {"role": "stubborn", "ignore_term": True}]},
                      tmp_path / "tree")
    (stubborn,) = tree.pids("stubborn")
    register(running, tree.pid)
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=60) == 0
    document = json.loads(state.read_text())
    assert document["phase"] == "done"
    outcomes = document["drain"]["outcomes"]
    assert [o["pid"] for o in outcomes if o["fate"] == "killed"] == [stubborn]
    truth = assert_summary_is_true(
        {"processes": outcomes, "outcome": document["drain"]["outcome"]}, tree,
        root_code=tree.root.wait(timeout=30), outcome="killed")
    assert [pid for pid, e in truth.items() if not e.cleanup] == [stubborn]
    assert truth[stubborn].exit_code == -9
    assert truth[tree.pid].exit_code == 0
