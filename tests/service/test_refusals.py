"""Refused input: wrong token, protected or unknown PIDs, malformed and absurd bodies.
Each answers a 4xx JSON ``detail``, records nothing and signals nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.service.servers import FAST, Running, start_coordinator
from tests.service.trees import start_time, start_tree
from tests.support.processes import ProcessJanitor

TOKEN = "correct-horse"


@pytest.fixture
def running(janitor: ProcessJanitor, tmp_path: Path) -> Running:
    return start_coordinator(janitor, tmp_path, *FAST, token=TOKEN)


def test_calls_without_the_right_token_are_refused(running: Running) -> None:
    """1. every protected call without a token, and with a wrong one, answers 401 with a
    detail; 2. /healthz, /readyz and /metrics need none; 3. nothing started draining."""
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/drain", None), ("POST", "/drain", {"wait": False}), ("DELETE", "/drain", None),
        ("GET", "/status", None), ("POST", "/workers", {"pid": os.getpid()}),
        ("DELETE", "/workers/w-1", None), ("GET", "/workers/w-1/events", None),
        ("POST", "/workers/w-1/report", {"inflight": 0}),
        ("POST", "/migrations/ack", {"request_ids": ["a"]}),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        for method, path, body in calls:
            answer = httpx.request(method, running.url + path, json=body, headers=headers)
            assert answer.status_code == 401, (method, path, answer.text)
            assert "token" in answer.json()["detail"]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(running.url + path).status_code == 200
    assert running.status()["phase"] == "serving"


def test_protected_and_unknown_pids_are_refused(
    running: Running, janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register PID 1, the coordinator, its parent (this test), a PID that does not exist,
    and a live tree with a wrong start time; 2. each answers 403 or 422 with a detail;
    3. no worker is recorded and the tree is still alive after a drain."""
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=0)
    refused = {
        1: 403, running.proc.pid: 403, os.getpid(): 403, 4_194_000: 422,
    }
    with running.client() as client:
        for pid, code in refused.items():
            answer = client.post("/workers", json={"pid": pid})
            assert answer.status_code == code, (pid, answer.text)
            assert str(pid) in answer.json()["detail"]
        wrong = client.post("/workers", json={"pid": tree["pid"],
                                              "start_time": start_time(tree["pid"]) - 5})
        assert wrong.status_code == 422
        assert "start time" in wrong.json()["detail"]
        assert client.get("/status").json()["workers"] == []
        assert client.get("/drain").json()["processes"] == []
    assert all(psutil.pid_exists(pid) for pid in tree["all"])


ABSURD: list[tuple[str, str, bytes | None]] = [
    ("POST", "/workers", b"{not json"),
    ("POST", "/workers", b"[]"),
    ("POST", "/workers", b'{"pid": -5}'),
    ("POST", "/workers", b'{"pid": 1099511627776}'),
    ("POST", "/workers", b'{"pid": "abc"}'),
    ("POST", "/workers", b'{"pid": 2, "tiers": [{"name": "x", "pattern": "("}]}'),
    ("POST", "/workers", b'{"pid": 2, "tiers": [{"name": "x", "signal": "SIGNOPE"}]}'),
    ("POST", "/workers", b'{"pid": 2, "role": "' + b"r" * 10_000 + b'"}'),
    ("POST", "/workers", b'{"pid": NaN}'),
    ("POST", "/workers", b'{"pid": 1e309}'),
    ("POST", "/workers", b'{"pid": 2, "start_time": -Infinity}'),
    ("POST", "/workers", b'{"pid": 2, "tiers": [{"name": "x", "timeout_s": NaN}]}'),
    ("POST", "/workers", b'{"pid": 2, "role": "\\ud800"}'),
    ("POST", "/drain", b'{"deadline_s": Infinity}'),
    ("POST", "/workers/w-nope/report", b'{"notified_at": NaN}'),
    ("POST", "/workers/w-nope/report",
     b'{"handoffs": [{"request_id": "r", "detail": {"x": NaN}}]}'),
    ("POST", "/workers/w-nope/report",
     b'{"handoffs": [{"request_id": "r", "detail": ' + b'{"d": ' * 500 + b"1" + b"}" * 500
     + b"}]}"),
    ("POST", "/drain", b'{"deadline_s": -1}'),
    ("POST", "/drain", b'{"deadline_s": 1e300}'),
    ("POST", "/drain", b'{"wait": "maybe"}'),
    ("POST", "/drain", b'{"surprise": 1}'),
    ("GET", "/status?wait=-1&since=0", None),
    ("GET", "/status?wait=1e9&since=0", None),
    ("GET", "/status?since=-3&wait=1", None),
    ("GET", "/status?since=99999999999999999999999&wait=1", None),
    ("POST", "/migrations/ack", b'{"request_ids": "r1"}'),
    ("POST", "/workers/w-nope/report", b'{"inflight": 0}'),
    ("DELETE", "/workers/w-nope", None),
    ("GET", "/workers/w-nope/events", None),
]


def not_strict_json(constant: str) -> None:
    raise ValueError(f"{constant} is not strict JSON")


def test_malformed_and_absurd_input_is_a_4xx(running: Running) -> None:
    """1. send each malformed or absurd input (non-finite numbers and a 500-deep handoff
    detail among them); 2. each gets a 4xx with a detail in strict JSON (no ``NaN`` echoed);
    3. nothing changed."""
    with running.client() as client:
        for method, path, body in ABSURD:
            answer = client.request(method, path, content=body,
                                    headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500, (method, path, answer.text)
            assert "detail" in json.loads(answer.content, parse_constant=not_strict_json)
        status = client.get("/status").json()
    assert status["phase"] == "serving"
    assert status["workers"] == []
