"""The kubelet's view: ``preStop`` ``httpGet`` on ``/drain`` with a token header, readiness,
SIGTERM after the hook."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.service.servers import FAST, Running, register, start_coordinator
from tests.service.trees import start_tree
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
    5. both answer 200 with phase done and the same processes, every one of the tree listed
       once with a final fate, and none of them is left;
    6. SIGTERM the coordinator: it exits 0 at once."""
    running = start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=1)
    register(running, tree["pid"], role="engine")
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
    pids = [p["pid"] for p in summaries[0]["processes"]]
    assert sorted(pids) == sorted(tree["all"])
    assert all(p["fate"] in ("exited", "gone") for p in summaries[0]["processes"])
    assert summaries[0]["outcome"] == "graceful"
    assert not [pid for pid in tree["all"] if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    again = _get_drain(running)
    assert again.json()["processes"] == summaries[0]["processes"]
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=30) == 0


def test_sigterm_during_a_drain_lets_it_finish_then_exits_0(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree whose one child ignores SIGTERM, with a state file;
    2. POST /drain wait=false and SIGTERM the coordinator at once;
    3. the coordinator keeps going: the stubborn child is SIGKILLed, the drain reaches done;
    4. then it exits 0, and the state file says done."""
    state = tmp_path / "state.json"
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state))
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1, stubborn=1)
    register(running, tree["pid"])
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=60) == 0
    document = json.loads(state.read_text())
    assert document["phase"] == "done"
    fates = {o["pid"]: o["fate"] for o in document["drain"]["outcomes"]}
    assert set(fates) == set(tree["all"])
    assert "killed" in fates.values()
    assert document["drain"]["outcome"] == "killed"
