"""shutdown_wire against a real coordinator: every string and form it names is what the
coordinator serves and accepts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import shutdown_wire as wire
import worker_client
from coordinator.drain.phases import Phase
from coordinator.service.worker_moves import WorkerState
from router_client import RouterStatus
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "wire-test-token"


class Events:
    """A worker's event stream, read in the background: each line's parsed JSON, in order."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()

    async def read(self, http: httpx.AsyncClient, url: str) -> None:
        async with http.stream("GET", url) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line:
                    async with self._changed:
                        self.seen.append(json.loads(line))
                        self._changed.notify_all()

    async def next_of(self, kind: str, after: int = 0) -> tuple[int, dict[str, Any]]:
        """The first event of type ``kind`` at index ``after`` or later (30 s at most)."""

        def found() -> tuple[int, dict[str, Any]] | None:
            return next(((i, e) for i, e in enumerate(self.seen)
                         if i >= after and e.get("type") == kind), None)

        async with asyncio.timeout(30), self._changed:
            await self._changed.wait_for(lambda: found() is not None)
        hit = found()
        assert hit is not None
        return hit


async def until(http: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool],
                what: str) -> dict[str, Any]:
    """Long-poll ``/status`` until ``check(document)`` (30 s at most)."""
    async with asyncio.timeout(30):
        document: dict[str, Any] = (await http.get("/status")).json()
        while not check(document):
            document = (await http.get("/status", params={
                "wait": 5, "since": document["generation"]})).json()
    assert check(document), what
    return document


@contextlib.asynccontextmanager
async def reading(http: httpx.AsyncClient, url: str) -> AsyncIterator[Events]:
    events = Events()
    task = asyncio.create_task(events.read(http, url))
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await task


async def test_every_phase_state_and_event_is_what_a_coordinator_serves(
    janitor: ProcessJanitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. A coordinator with a token, pings every 0.2 s and a 3 s minimum drain. Without the
       token /status is refused (401); with ``bearer_header`` it answers.
    2. An engine (``sleep``) registers with a ``Tier`` in its wire form: the answer's phase
       is ``PHASE_SERVING``, and ``/plan`` shows the tier holding the engine.
    3. Its event stream starts with ``EVENT_HELLO`` (phase ``PHASE_SERVING``) and carries
       ``EVENT_PING``; /status says ``PHASE_SERVING``, the worker ``WORKER_SERVING``.
    4. The engine reports 1 in flight; POST /drain: ``EVENT_DRAIN`` on the stream,
       ``PHASE_MIGRATING`` and ``WORKER_DRAINING`` in /status (``PHASE_DRAINING`` in the
       timeline). DELETE /drain: ``EVENT_ABORT``, back to ``PHASE_SERVING``.
    5. POST /drain again, the engine reports 0 in flight: ``WORKER_DRAINED`` while the
       minimum drain holds; then ``EVENT_TERMINATE``, ``PHASE_TERMINATING`` and
       ``WORKER_TERMINATING`` while the coordinator waits for the pre-kill report.
    6. The engine reports ``prekill_done``; the kill ends it: ``PHASE_DONE``,
       ``WORKER_EXITED``.
    7. Every /status answer along the way parses as a router_client RouterStatus, and
       every state seen is one the wire module names, as are the coordinator's own enums."""
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_PING_INTERVAL_S", "0.2")
    running = start_coordinator(janitor, tmp_path, *FAST, "--min-drain", "3", token=TOKEN)
    engine = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    phases_seen: set[str] = set()
    states_seen: set[str] = set()

    def note(document: dict[str, Any]) -> dict[str, Any]:
        RouterStatus.from_json(document)
        phases_seen.add(document["phase"])
        states_seen.update(w["state"] for w in document["workers"])
        return document

    def state(document: dict[str, Any]) -> str:
        note(document)
        return str(document["workers"][0]["state"])

    async with httpx.AsyncClient(base_url=running.url, timeout=30) as anonymous:
        assert (await anonymous.get("/status")).status_code == 401
    async with httpx.AsyncClient(base_url=running.url, timeout=30,
                                 headers=wire.bearer_header(TOKEN)) as http:
        tier = wire.Tier("engine", pattern=r"sleep 600$", timeout_s=2.0, include_root=True)
        answer = await http.post("/workers", json={"pid": engine.pid, "role": "worker",
                                                   "tiers": [tier.to_json()]})
        assert answer.status_code == 201, answer.text
        assert answer.json()["phase"] == wire.PHASE_SERVING
        worker_id = answer.json()["id"]

        def planned() -> list[tuple[str, list[int]]]:  # once a scan listed the new tree
            with running.client() as client:
                return [(t["tier"], [p["pid"] for p in t["processes"]])
                        for t in client.get("/plan").json()["tiers"] if t["processes"]]

        assert wait_for(planned, what="the engine planned") == [("engine", [engine.pid])]
        report = f"/workers/{worker_id}/report"

        async with reading(http, f"/workers/{worker_id}/events") as events:
            _, hello = await events.next_of(wire.EVENT_HELLO)
            assert (hello["id"], hello["phase"]) == (worker_id, wire.PHASE_SERVING)
            await events.next_of(wire.EVENT_PING)
            status = note((await http.get("/status")).json())
            assert (status["phase"], state(status)) == (wire.PHASE_SERVING,
                                                        wire.WORKER_SERVING)

            assert (await http.post(report, json={"inflight": 1})).status_code == 200
            assert (await http.post("/drain", json={"wait": False})).status_code == 202
            at, _ = await events.next_of(wire.EVENT_DRAIN)
            status = await until(http, lambda d: d["phase"] == wire.PHASE_MIGRATING,
                                 "migrating")
            assert state(status) == wire.WORKER_DRAINING
            full = note((await http.get("/status")).json())
            phases_seen.update(t["phase"] for t in full["timeline"])
            assert full["timeline"][-2]["phase"] == wire.PHASE_DRAINING
            assert (await http.delete("/drain")).status_code == 200
            at, _ = await events.next_of(wire.EVENT_ABORT, at)
            status = await until(http, lambda d: d["phase"] == wire.PHASE_SERVING, "serving")
            assert state(status) == wire.WORKER_SERVING

            assert (await http.post("/drain", json={"wait": False})).status_code == 202
            at, _ = await events.next_of(wire.EVENT_DRAIN, at)
            assert (await http.post(report, json={"inflight": 0})).status_code == 200
            status = await until(http, lambda d: state(d) == wire.WORKER_DRAINED, "drained")
            assert status["phase"] in (wire.PHASE_DRAINING, wire.PHASE_MIGRATING)
            await events.next_of(wire.EVENT_TERMINATE, at)
            status = await until(http, lambda d: d["phase"] == wire.PHASE_TERMINATING,
                                 "terminating")
            assert state(status) == wire.WORKER_TERMINATING
            assert (await http.post(report, json={"prekill_done": True})).status_code == 200
            status = await until(http, lambda d: d["phase"] == wire.PHASE_DONE, "done")
            assert state(status) == wire.WORKER_EXITED

    assert phases_seen == set(wire.PHASES)
    assert states_seen == set(wire.WORKER_STATES)
    assert set(wire.PHASES) - {wire.PHASE_SERVING} == wire.DRAIN_PHASES
    assert [p.value for p in Phase] == list(wire.PHASES)
    assert [s.value for s in WorkerState] == list(wire.WORKER_STATES)


def test_the_clients_use_the_wire_module_s_forms() -> None:
    """1. worker_client's ``Tier`` and ``handed_back_event`` are the wire module's.
    2. A tier at its defaults is written with its name and signal only; every field set is
       written under the name the coordinator's registration accepts."""
    assert worker_client.Tier is wire.Tier
    assert worker_client.handed_back_event is wire.handed_back_event
    assert wire.Tier("t").to_json() == {"name": "t", "signal": "SIGTERM"}
    assert wire.Tier("t", pattern="p", roles=("a",), signal="SIGINT", timeout_s=3.0,
                     include_root=True).to_json() == {
        "name": "t", "pattern": "p", "roles": ["a"], "signal": "SIGINT", "timeout_s": 3.0,
        "include_root": True}
    assert wire.bearer_header(None) == {} == wire.bearer_header("")
    assert wire.bearer_header("x") == {"Authorization": "Bearer x"}


def test_public_surface() -> None:
    """1. Every name in ``shutdown_wire.__all__`` exists, and every public name is in it."""
    assert sorted(wire.__all__) == sorted(
        n for n in vars(wire) if not n.startswith("_") and n not in ("annotations", "dataclass",
                                                                       "Any", "Final"))
    for name in wire.__all__:
        assert hasattr(wire, name), name


def test_the_wire_module_needs_only_the_standard_library() -> None:
    """1. Import shutdown_wire in a fresh interpreter.
    2. Every module it loaded is the standard library's, or its own."""
    code = ("import json, sys\nbefore = set(sys.modules)\nimport shutdown_wire\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    # Without the test run's coverage hook (scripts/test.sh), which would load coverage into
    # the interpreter at the first import of a measured package.
    env = {k: v for k, v in os.environ.items() if k != "COORDINATOR_TEST_COVERAGE"}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60, env=env)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert "shutdown_wire" in loaded
    assert loaded - sys.stdlib_module_names - {"shutdown_wire"} == set()
