"""Hostile input never breaks ``/status`` or the drain: a deeply nested or non-finite handoff
``detail``, ``NaN``/``Infinity``/``1e309`` in every numeric field, a thread id or a kernel
thread registered as a worker. Each answers a 422 (or 403) with a strict-JSON ``detail``,
never a 5xx, stores nothing, and the drain that follows still runs to ``done``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from coordinator.service.models import DETAIL_MAX_BYTES, DETAIL_MAX_DEPTH
from tests.service.servers import FAST, Running, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "hostile-token"
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e309", "-1e309"]
PF_KTHREAD = 0x00200000
JSON_HEADERS = {"content-type": "application/json"}


def strict_json(text: str | bytes) -> Any:
    """Parse as strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are errors."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def nested(depth: int) -> dict[str, Any]:
    """A ``detail`` object ``depth`` levels deep (the outermost object is level 1)."""
    document: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        document = {"d": document}
    return document


def nested_list(depth: int) -> list[Any]:
    """A list ``depth`` levels deep."""
    document: list[Any] = ["leaf"]
    for _ in range(depth - 1):
        document = [document]
    return document


def assert_422(answer: httpx.Response, what: str) -> Any:
    """A 422 whose body is strict JSON with a non-empty ``detail``; returns the detail."""
    assert answer.status_code == 422, (what, answer.status_code, answer.text[:300])
    assert answer.headers["content-type"].startswith("application/json"), what
    detail = strict_json(answer.content)["detail"]
    assert detail, what
    return detail


def strict_status(running: Running) -> dict[str, Any]:
    """``/status`` (both views) answers 200 with strict JSON; returns the full view."""
    with running.client() as client:
        router = client.get("/status", params={"view": "router"})
        assert router.status_code == 200, router.text[:300]
        strict_json(router.content)
        full = client.get("/status")
        assert full.status_code == 200, full.text[:300]
        document: dict[str, Any] = strict_json(full.content)
        return document


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "state.json"


@pytest.fixture
def running(janitor: ProcessJanitor, tmp_path: Path, state_file: Path) -> Running:
    return start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state_file),
                             token=TOKEN)


def test_a_deep_or_huge_detail_is_refused_and_the_drain_still_runs(
    running: Running, janitor: ProcessJanitor, state_file: Path
) -> None:
    """1. register a sleeper; 2. report handoffs whose ``detail`` nests 500 levels, one level
    past the limit, is larger than the size limit, or holds a non-JSON value: each a 422 that
    does not echo the input, nothing stored; 3. a detail exactly at the depth limit is
    accepted; 4. ``/status`` answers 200 with strict JSON throughout; 5. the drain runs to
    ``done``, its summary and the state file are strict JSON, and the sleeper was ended."""
    sleeper = janitor.spawn(["sleep", "600"])
    worker_id = register(running, sleeper.pid)["id"]
    report = f"/workers/{worker_id}/report"
    refused: dict[str, Any] = {
        "500 levels": nested(500),
        "one level too deep": nested(DETAIL_MAX_DEPTH + 1),
        "a list one level too deep": {"l": nested_list(DETAIL_MAX_DEPTH)},
        "too large": {"blob": "x" * DETAIL_MAX_BYTES},
        "too large a string": "y" * (DETAIL_MAX_BYTES + 1),
        "too many elements": {"many": [0] * DETAIL_MAX_BYTES},
        "a number": 7,
    }
    with running.client() as client:
        for what, detail in refused.items():
            answer = client.post(report, json={"handoffs": [
                {"request_id": f"r-{what}", "tokens": 1, "detail": detail}]})
            errors = assert_422(answer, what)
            assert any("detail" in error["loc"] for error in errors), (what, errors)
            assert len(answer.content) < 4096, (what, "the 422 echoes the input")
            assert strict_status(running)["migrations"] == [], what
        deepest = nested(DETAIL_MAX_DEPTH)
        accepted = client.post(report, json={"handoffs": [
            {"request_id": "r-ok", "tokens": 3, "detail": deepest}]})
        assert accepted.status_code == 200, accepted.text
    status = strict_status(running)
    assert [m["request_id"] for m in status["migrations"]] == ["r-ok"]

    with running.client() as client:
        summary = client.get("/drain")
    assert summary.status_code == 200, summary.text[:300]
    assert strict_json(summary.content)["phase"] == "done"
    assert strict_status(running)["phase"] == "done"
    strict_json(state_file.read_bytes())
    assert sleeper.wait(timeout=30) is not None


def handoffs(fields: str) -> str:
    """A report body with one handoff of ``fields`` (raw JSON)."""
    return '{"handoffs": [{' + fields + '}]}'


def cases(worker_id: str, literal: str) -> list[tuple[str, str, str]]:
    """(what, path, raw JSON body) with ``literal`` in each numeric field of every body."""
    report = f"/workers/{worker_id}/report"
    return [
        ("pid", "/workers", f'{{"pid": {literal}}}'),
        ("start_time", "/workers", f'{{"pid": {os.getpid()}, "start_time": {literal}}}'),
        ("tier timeout_s", "/workers",
         f'{{"pid": {os.getpid()}, "tiers": [{{"name": "t", "timeout_s": {literal}}}]}}'),
        ("deadline_s", "/drain", f'{{"wait": false, "deadline_s": {literal}}}'),
        ("wait", "/drain", f'{{"wait": {literal}}}'),
        ("inflight", report, f'{{"inflight": {literal}}}'),
        ("notified_at", report, f'{{"notified_at": {literal}}}'),
        ("prekill_done", report, f'{{"prekill_done": {literal}}}'),
        ("handoff tokens", report, handoffs(f'"request_id": "r", "tokens": {literal}')),
        ("handoff request_id", report, handoffs(f'"request_id": {literal}')),
        ("detail", report, handoffs(f'"request_id": "r", "detail": {{"x": {literal}}}')),
        ("nested detail", report,
         handoffs(f'"request_id": "r", "detail": {{"a": [1, {{"b": [{literal}]}}]}}')),
        ("ack", "/migrations/ack", f'{{"request_ids": [{literal}]}}'),
    ]


def test_non_finite_numbers_are_a_422_in_every_field(
    running: Running, janitor: ProcessJanitor
) -> None:
    """1. register a sleeper; 2. send NaN, ±Infinity and ±1e309 in every numeric field of
    every body, inside a handoff's detail, and in ``/status``'s query; 3. each answers 422
    with a strict-JSON detail, never a 5xx; 4. nothing was stored or started: ``/status`` is
    strict JSON, still ``serving``, with one worker and no migration."""
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    worker_id = register(running, sleeper.pid)["id"]
    with running.client() as client:
        for literal in NON_FINITE:
            for what, path, body in cases(worker_id, literal):
                answer = client.post(path, content=body.encode(), headers=JSON_HEADERS)
                assert_422(answer, f"{what} = {literal}")
            for query in (f"wait={literal}&since=0", f"since={literal}&wait=1"):
                answer = client.get("/status?" + query)
                assert_422(answer, query)
    status = strict_status(running)
    assert status["phase"] == "serving"
    assert [w["pid"] for w in status["workers"]] == [sleeper.pid]
    assert status["migrations"] == []
    assert status["workers"][0]["inflight"] is None


THREADED = ("import threading, time; "
            "threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
            "time.sleep(600)")


def test_a_thread_id_is_not_a_process(running: Running, janitor: ProcessJanitor) -> None:
    """1. start a python child with a second thread and read that thread's id from
    ``/proc/<pid>/task``; 2. registering the thread id answers 422 naming it a thread of the
    child; 3. the child itself (the thread-group leader) registers; 4. only it is listed."""
    child = janitor.spawn_python(["-c", THREADED], service=True, exit_code=-signal.SIGTERM)
    task = Path(f"/proc/{child.pid}/task")
    tids = wait_for(lambda: [int(t) for t in os.listdir(task) if int(t) != child.pid],
                    what="the child's second thread")
    tid = tids[0]
    with running.client() as client:
        answer = client.post("/workers", json={"pid": tid})
        detail = assert_422(answer, "thread id")
        assert detail.startswith(f"pid {tid}: "), detail
        assert f"a thread of process {child.pid}" in detail, detail
        assert client.get("/status").json()["workers"] == []
        leader = client.post("/workers", json={"pid": child.pid})
        assert leader.status_code == 201, leader.text
    assert [w["pid"] for w in strict_status(running)["workers"]] == [child.pid]


def kthread_flags(pid: int) -> int | None:
    """The ``flags`` field of ``/proc/<pid>/stat``, or None when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2:].split()[6])


def test_kernel_threads_are_refused(running: Running) -> None:
    """1. when PID 2 is the kernel's ``kthreadd`` (PF_KTHREAD set) here, register it and one
    of its children; 2. each answers 403 naming a kernel thread (not "no such process");
    3. no worker is recorded."""
    flags = kthread_flags(2)
    if flags is None:
        pytest.skip("no /proc/2 here (a PID namespace without it)")
    if not flags & PF_KTHREAD:
        pytest.skip("PID 2 is an ordinary process here (a PID namespace), not kthreadd")
    kthreads = [2]
    for proc in psutil.Process(2).children():
        child_flags = kthread_flags(proc.pid)
        if child_flags is not None and child_flags & PF_KTHREAD:
            kthreads.append(proc.pid)
            break
    with running.client() as client:
        for pid in kthreads:
            answer = client.post("/workers", json={"pid": pid})
            assert answer.status_code == 403, (pid, answer.text)
            detail = strict_json(answer.content)["detail"]
            assert detail == f"refusing to signal pid {pid}: it is a kernel thread", detail
        assert client.get("/status").json()["workers"] == []
