"""The operator's view: POST /drain without waiting, following /status, aborting; and the
workers' event stream along the way."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.kill.helpers import alive, start_tree
from tests.service.servers import FAST, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

FAMILY = {"role": "root", "children": [
    {"role": "child", "children": [{"role": "grandchild"}, {"role": "grandchild"}]},
    {"role": "child", "children": [{"role": "grandchild"}, {"role": "grandchild"}]},
]}
"""A root, 2 children, 4 grandchildren: each runs its cleanup on SIGTERM and records it."""


def _long_poll(client: httpx.Client, since: int) -> dict[str, Any]:
    response = client.get("/status", params={"wait": 20, "since": since})
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


def test_post_without_waiting_then_follow_status_to_done(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree; 2. POST /drain {"wait": false, "reason": ...} answers 202 at once;
    3. long-poll /status with since=G: each answer has a higher generation, and the phases
       seen go forward to done; 4. the final document tells what really happened: every
       process (and no other) listed once, each ran its own cleanup (its record), nothing
       runs, the root's wait status is its exit code, the outcome graceful;
    5. ETag + If-None-Match answers 304 while nothing changes."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, FAMILY, tmp_path / "tree")
    register(running, tree.pid)
    with running.client() as client:
        started = client.post("/drain", json={"wait": False, "reason": "rollout",
                                              "deadline_s": 8})
        assert started.status_code == 202
        assert started.json()["drain"]["budget_s"] == 8
        since = started.json()["generation"] - 1
        phases: list[str] = []
        while not phases or phases[-1] != "done":
            document = _long_poll(client, since)
            assert document["generation"] > since
            since = document["generation"]
            phases.append(document["phase"])
        order = ["draining", "migrating", "terminating", "done"]
        assert [order.index(p) for p in phases] == sorted(order.index(p) for p in phases)
        assert document["drain"]["reason"] == "rollout"
        truth = assert_summary_is_true(document, tree, root_code=tree.root.wait(timeout=30))
        assert {e.fate for e in truth.values()} == {"exited"}
        etag = client.get("/status").headers["etag"]
        assert client.get("/status", headers={"If-None-Match": etag}).status_code == 304
        metrics = httpx.get(running.url + "/metrics").text
        assert 'shutdown_coordinator_drains_total{outcome="graceful"} 1.0' in metrics


def test_delete_aborts_before_terminating_and_409_after(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree as a worker, open its event stream (hello arrives at once);
    2. the worker reports 1 request in flight, so the drain holds in migrating;
    3. POST /drain wait=false: the stream gets a drain line, /readyz is 503;
    4. DELETE /drain: 200, phase serving, the stream gets abort, /readyz 200 again, and the
       tree is untouched (every process runs; none got SIGTERM: none wrote its record);
    5. drain again; the worker reports 0 in flight; the stream gets terminate; the drain
       reaches done, and its summary is what happened (the processes' records, their
       parents' and the test's wait statuses, /proc); DELETE /drain now answers 409."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, {"children": [{"children": [{}]}]}, tmp_path / "tree")
    worker = register(running, tree.pid, url="http://127.0.0.1:1")
    with running.client() as client, client.stream(
            "GET", worker["events_url"], timeout=60) as stream:
        lines = stream.iter_lines()
        assert json.loads(next(lines))["type"] == "hello"
        report = f"/workers/{worker['id']}/report"
        assert client.post(report, json={"inflight": 1}).status_code == 200
        assert client.post("/drain", json={"wait": False}).status_code == 202
        assert json.loads(next(lines))["type"] == "drain"
        assert httpx.get(running.url + "/readyz").status_code == 503
        wait_for(lambda: running.status()["phase"] == "migrating", what="migrating")

        aborted = client.delete("/drain")
        assert aborted.status_code == 200, aborted.text
        assert aborted.json()["phase"] == "serving"
        assert json.loads(next(lines))["type"] == "abort"
        assert httpx.get(running.url + "/readyz").status_code == 200
        assert all(alive(pid) for pid in tree.pids())
        assert tree.markers() == {}
        assert client.delete("/drain").status_code == 409

        assert client.post("/drain", json={"wait": False}).status_code == 202
        assert json.loads(next(lines))["type"] == "drain"
        assert client.post(report, json={"inflight": 0}).status_code == 200
        terminate = json.loads(next(lines))
        assert terminate["type"] == "terminate"
        assert client.post(report, json={"prekill_done": True}).status_code == 200
        done = client.get("/drain").json()
        assert done["phase"] == "done"
        assert client.delete("/drain").status_code == 409
    assert_summary_is_true(done, tree, root_code=tree.root.wait(timeout=30))


def test_handoffs_stay_listed_until_acknowledged(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a worker that reports 2 in flight; drain; 2. the worker hands back two
    requests and reports 0 in flight; 3. the drain is in migrating (not draining), and
    /status lists both migrations there;
    4. a router acknowledges them (and one id never reported, which it remembers as
       early): the drain moves on to done, and its timeline shows it left migrating only
       after the acknowledgement was sent; the summary is what happened to the tree."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, {"children": [{}]}, tmp_path / "tree")
    worker = register(running, tree.pid, url="http://w1")
    with running.client() as client:
        client.post(f"/workers/{worker['id']}/report", json={"inflight": 2})
        assert client.post("/drain", json={"wait": False}).status_code == 202
        handoffs = [{"request_id": "r1", "tokens": 7}, {"request_id": "r2", "tokens": 0}]
        client.post(f"/workers/{worker['id']}/report",
                    json={"inflight": 0, "handoffs": handoffs})
        status = wait_for(lambda: (s := running.status())["phase"] == "migrating" and s,
                          what="the drain in migrating")
        assert {(m["request_id"], m["worker"], m["tokens"], m["worker_url"])
                for m in status["migrations"]} == {("r1", worker["id"], 7, "http://w1"),
                                                   ("r2", worker["id"], 0, "http://w1")}
        acked_at = time.time()
        acked = client.post("/migrations/ack", json={"request_ids": ["r1", "r2", "zz"]})
        assert acked.json() == {"acked": ["r1", "r2"], "early": ["zz"], "unknown": []}
        done = client.get("/drain").json()
        assert done["phase"] == "done"
        assert done["migration_counts"]["acked"] == 2
        assert done["migrations"] == []
    terminating = [t["at"] for t in done["timeline"] if t["phase"] == "terminating"]
    assert len(terminating) == 1
    assert terminating[0] >= acked_at
    assert_summary_is_true(done, tree, root_code=tree.root.wait(timeout=30))


