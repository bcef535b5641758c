"""The operator's view: POST /drain without waiting, following /status, aborting; and the
workers' event stream along the way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


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
       seen go forward to done; 4. the summary lists every process with a final fate;
    5. ETag + If-None-Match answers 304 while nothing changes."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=2)
    register(running, tree["pid"])
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
        assert sorted(p["pid"] for p in document["processes"]) == sorted(tree["all"])
        assert {p["fate"] for p in document["processes"]} <= {"exited", "gone"}
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
       tree is untouched;
    5. drain again; the worker reports 0 in flight; the stream gets terminate; the drain
       reaches done; DELETE /drain now answers 409."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1)
    worker = register(running, tree["pid"], url="http://127.0.0.1:1")
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
        assert all(psutil.pid_exists(pid) for pid in tree["all"])
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


def test_handoffs_stay_listed_until_acknowledged(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a worker that reports 2 in flight; drain; 2. the worker hands back two
    requests and reports 0 in flight; 3. /status lists both migrations while the drain
    waits in migrating;
    4. a router acknowledges them (and one id never reported, which it remembers as
       early): the drain moves on to done."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=0)
    worker = register(running, tree["pid"], url="http://w1")
    with running.client() as client:
        client.post(f"/workers/{worker['id']}/report", json={"inflight": 2})
        assert client.post("/drain", json={"wait": False}).status_code == 202
        handoffs = [{"request_id": "r1", "tokens": 7}, {"request_id": "r2", "tokens": 0}]
        client.post(f"/workers/{worker['id']}/report",
                    json={"inflight": 0, "handoffs": handoffs})
        status = client.get("/status").json()
        assert status["phase"] in ("draining", "migrating")
        assert {(m["request_id"], m["worker"], m["tokens"], m["worker_url"])
                for m in status["migrations"]} == {("r1", worker["id"], 7, "http://w1"),
                                                   ("r2", worker["id"], 0, "http://w1")}
        acked = client.post("/migrations/ack", json={"request_ids": ["r1", "r2", "zz"]})
        assert acked.json() == {"acked": ["r1", "r2"], "early": ["zz"], "unknown": []}
        done = client.get("/drain").json()
        assert done["phase"] == "done"
        assert done["migration_counts"]["acked"] == 2
        assert done["migrations"] == []


