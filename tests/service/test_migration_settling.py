"""When the migrating phase may end: workers that must report first, and acknowledgements
that arrive before the handoff they acknowledge."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


def _at(summary: dict[str, Any], phase: str) -> float:
    return float(next(t["at"] for t in summary["timeline"] if t["phase"] == phase))


def test_a_connected_worker_holds_migrating_until_it_reports_zero(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Register two workers (default --min-drain 0); only the first opens its event
       stream; neither has ever reported an in-flight count.
    2. POST /drain wait=false; the stream gets the drain line.
    3. /status: the drain is in draining or migrating, the connected worker is
       awaiting_report, the never-connected one is not (it counts as drained at once).
    4. The connected worker reports inflight 1: still migrating.
    5. It reports inflight 0 (the moment noted just before the call); it gets terminate;
       the drain reaches done; terminating began after that report, before the migration
       deadline."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    connected = register(running, start_tree(janitor, tmp_path, children=1)["pid"])
    register(running, start_tree(janitor, tmp_path, children=1)["pid"])
    report = f"/workers/{connected['id']}/report"
    with running.client() as client:
        with client.stream("GET", connected["events_url"], timeout=60) as stream:
            lines = stream.iter_lines()
            assert json.loads(next(lines))["type"] == "hello"
            assert client.post("/drain", json={"wait": False}).status_code == 202
            assert json.loads(next(lines))["type"] == "drain"
            status = running.status()
            assert status["phase"] in ("draining", "migrating"), status["timeline"]
            waiting = {w["id"]: w["awaiting_report"] for w in status["workers"]}
            assert waiting.pop(connected["id"]) is True, status["workers"]
            assert list(waiting.values()) == [False], status["workers"]
            assert client.post(report, json={"inflight": 1}).status_code == 200
            status = running.status()
            assert status["phase"] == "migrating", status["timeline"]
            reported_at = time.time()
            assert client.post(report, json={"inflight": 0}).status_code == 200
            assert json.loads(next(lines))["type"] == "terminate"
            assert client.post(report, json={"prekill_done": True}).status_code == 200
        summary = client.get("/drain").json()
    assert summary["phase"] == "done", summary["timeline"]
    assert reported_at <= _at(summary, "terminating"), summary["timeline"]
    assert _at(summary, "terminating") < summary["drain"]["migration_deadline_at"]


def test_a_worker_that_disconnects_without_reporting_releases_the_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Register a worker and open its event stream.
    2. POST /drain wait=false; read the drain line; it is awaiting_report.
    3. Close the stream without reporting anything.
    4. The drain goes on to done at once: terminating begins before the migration
       deadline and after the worker stopped awaiting."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    worker = register(running, start_tree(janitor, tmp_path, children=1)["pid"])
    with running.client() as client:
        with client.stream("GET", worker["events_url"], timeout=60) as stream:
            lines = stream.iter_lines()
            assert json.loads(next(lines))["type"] == "hello"
            assert client.post("/drain", json={"wait": False}).status_code == 202
            assert json.loads(next(lines))["type"] == "drain"
            status = running.status()
            assert status["phase"] in ("draining", "migrating"), status["timeline"]
            assert status["workers"][0]["awaiting_report"] is True
        summary = client.get("/drain").json()
    assert summary["phase"] == "done", summary["timeline"]
    assert summary["workers"][0]["awaiting_report"] is False
    assert _at(summary, "terminating") < summary["drain"]["migration_deadline_at"]


def test_an_early_acknowledgement_settles_the_handoff_when_it_arrives(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Register a worker that reports 2 in flight; POST /drain wait=false.
    2. A router acknowledges r1 before the worker reported it: the answer lists it as
       early (not unknown); acknowledging it again is harmless (still early).
    3. The worker hands back r1 and r2 and reports 0 in flight: /status lists only r2;
       the counts say 2 handed back, 1 acknowledged.
    4. The router acknowledges r2: acked; acknowledging r1 now answers unknown (settled).
    5. The drain moves on to done with nothing pending and nothing expired."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    worker = register(running, start_tree(janitor, tmp_path, children=1)["pid"],
                      url="http://w1")
    report = f"/workers/{worker['id']}/report"
    with running.client() as client:
        assert client.post(report, json={"inflight": 2}).status_code == 200
        assert client.post("/drain", json={"wait": False}).status_code == 202
        for _ in range(2):
            early = client.post("/migrations/ack", json={"request_ids": ["r1"]})
            assert early.json() == {"acked": [], "early": ["r1"], "unknown": []}
        assert running.status()["migration_counts"]["early_acks"] == 1
        handoffs = [{"request_id": "r1", "tokens": 7}, {"request_id": "r2", "tokens": 3}]
        assert client.post(report, json={"inflight": 0, "handoffs": handoffs}).status_code == 200
        status = running.status()
        assert [m["request_id"] for m in status["migrations"]] == ["r2"]
        assert status["migration_counts"] == {
            "handed_back": 2, "acked": 1, "expired": 0, "pending": 1, "early_acks": 0}
        assert status["phase"] == "migrating", status["timeline"]
        answer = client.post("/migrations/ack", json={"request_ids": ["r2", "r1"]})
        assert answer.json() == {"acked": ["r2"], "early": [], "unknown": ["r1"]}
        done = client.get("/drain").json()
    assert done["phase"] == "done"
    assert done["migrations"] == []
    assert done["migration_counts"]["acked"] == 2
    assert done["migration_counts"]["expired"] == 0
    wait_for(lambda: running.status()["phase"] == "done", what="done")
