"""Refused input: wrong token, protected or unknown PIDs, malformed and absurd bodies.
Each answers a 4xx JSON ``detail``, records nothing and signals nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kill.helpers import alive, start_time, start_tree
from tests.service.servers import FAST, Running, start_coordinator
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
    3. no worker is recorded, and after a drain the tree still runs with no process
       signalled (none wrote the record its SIGTERM cleanup writes)."""
    tree = start_tree(janitor, {"children": [{}]}, tmp_path / "tree")
    refused = {
        1: 403, running.proc.pid: 403, os.getpid(): 403, 4_194_000: 422,
    }
    with running.client() as client:
        for pid, code in refused.items():
            answer = client.post("/workers", json={"pid": pid})
            assert answer.status_code == code, (pid, answer.text)
            assert str(pid) in answer.json()["detail"]
        wrong = client.post("/workers", json={"pid": tree.pid,
                                              "start_time": start_time(tree.pid) - 5})
        assert wrong.status_code == 422
        assert "start time" in wrong.json()["detail"]
        assert client.get("/status").json()["workers"] == []
        assert client.get("/drain").json()["processes"] == []
    assert all(alive(pid) for pid in tree.pids())
    assert tree.markers() == {}
    tree.end()


ABSURD: list[tuple[str, str, bytes | None]] = [
    ("POST", "/workers", b"{not json"),
    ("POST", "/workers", b"[]"),
    ("POST", "/workers", b'{"pid": -5}'),
    ("POST", "/workers", b'{"pid": 1099511627776}'),
    ("POST", "/workers", b'{"pid": "abc"}'),
    ("POST", "/workers", b'{"pid": NaN}'),
    ("POST", "/workers", b'{"pid": 1e309}'),
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

BAD_FIELDS: list[tuple[bytes, str]] = [
    (b'"tiers": [{"name": "x", "pattern": "("}]', "pattern"),
    (b'"tiers": [{"name": "x", "signal": "SIGNOPE"}]', "signal"),
    (b'"role": "' + b"r" * 10_000 + b'"', "role"),
    (b'"start_time": -Infinity', "start_time"),
    (b'"tiers": [{"name": "x", "timeout_s": NaN}]', "timeout_s"),
    (b'"role": "\\ud800"', "role"),
]
"""Registrations of a live process the test owns, which the coordinator accepts as it is,
each with one bad field: each must be refused for that field (the detail names it), never
because the PID is unknown or not a process (PID 2 may be a kernel thread, or not exist)."""


def not_strict_json(constant: str) -> None:
    raise ValueError(f"{constant} is not strict JSON")


def test_malformed_and_absurd_input_is_a_4xx(
    running: Running, janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. send each malformed or absurd input (non-finite numbers and a 500-deep handoff
    detail among them), and register a live process with one bad field at a time; 2. each
    gets a 4xx with a detail in strict JSON (no ``NaN`` echoed), and each bad field is
    named in its detail; 3. nothing changed; 4. the same live process with no bad field is
    accepted (so the refusals were about the fields)."""
    tree = start_tree(janitor, {}, tmp_path / "tree")
    registrations = [("POST", "/workers", b'{"pid": %d, %s}' % (tree.pid, field), name)
                     for field, name in BAD_FIELDS]
    rows = [(m, p, b, None) for m, p, b in ABSURD] + registrations
    with running.client() as client:
        for method, path, body, name in rows:
            answer = client.request(method, path, content=body,
                                    headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500, (method, path, answer.text)
            document = json.loads(answer.content, parse_constant=not_strict_json)
            assert "detail" in document
            if name is not None:
                assert answer.status_code == 422, (body, answer.text)
                assert name in {str(part) for d in document["detail"] for part in d["loc"]}, (
                    body, answer.text)
        status = client.get("/status").json()
        assert status["phase"] == "serving"
        assert status["workers"] == []
        accepted = client.post("/workers", json={"pid": tree.pid})
        assert accepted.status_code == 201, accepted.text
    tree.end()
