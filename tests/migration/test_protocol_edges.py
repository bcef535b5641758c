"""The protocol's edges: a router that never acknowledges, a coordinator that comes late, a
SIGTERM that reaches the engine directly.

The engine that drains holds its streams after a few tokens until they are handed back
(``--hold-after-tokens``), so each drain lands mid-stream without racing the token clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx

from devstack.sim.launcher import start_engine
from devstack.sim.tokens import expected_tokens
from router_client import sse
from tests.migration.stack import (
    ENGINE,
    Load,
    Pod,
    free_port,
    registered,
    start_pod,
    start_router,
    summary_is_graceful,
)
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


async def _stream(url: str, request_id: str, prompt: str, max_tokens: int,
                  first: asyncio.Event | None = None) -> list[dict[str, Any] | str]:
    """Every event of one completion streamed straight from an engine."""
    got: list[dict[str, Any] | str] = []
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id}
    ) as resp:
        async for event in sse.events(resp.aiter_lines()):
            got.append(event)
            if first is not None and len(got) == 2:
                first.set()
    return got


async def test_router_that_never_acknowledges(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. One pod with a 5 s budget, its streams held after 2 tokens; 4 streams straight to
       its engine (no router, so no one will ever acknowledge a handoff).
    2. Once each has 2 tokens, start the drain (POST /drain, wait=false).
    3. Each stream ends with the handed-back event; /status lists the 4 migrations while the
       phase is migrating.
    4. A request that arrives during the drain (before the engine has any id of its own for
       it) is handed back at once with 0 tokens.
    5. The migrating phase holds until its deadline, then the drain still ends: phase done,
       the tree ended gracefully; at the budget's end the 5 handoffs expire."""
    pod = start_pod(janitor, tmp_path, "pod", "--grace-period", "6", hold_after_tokens=2)
    coordinator = pod.coordinator
    assert coordinator is not None
    warm = [asyncio.Event() for _ in range(4)]
    tasks = [asyncio.create_task(_stream(pod.engine.url, f"r{i}", f"p{i}", 200, warm[i]))
             for i in range(4)]
    for event in warm:
        await asyncio.wait_for(event.wait(), 60)
    started = await asyncio.to_thread(
        httpx.post, f"{coordinator.url}/drain", json={"wait": False}, timeout=30)
    assert started.status_code == 202

    results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    for i, events in enumerate(results):
        last = events[-1]
        assert isinstance(last, dict), events[-2:]
        assert last.get("handed_back"), events[-2:]
        assert last["request_id"] == f"r{i}"
        texts = [sse.chunk_text(e) for e in events[:-1] if isinstance(e, dict)]
        assert texts == expected_tokens(f"p{i}", last["tokens"])

    def listed() -> dict[str, Any] | None:
        status = coordinator.status()
        ids = {m["request_id"] for m in status["migrations"]}
        return status if ids == {"r0", "r1", "r2", "r3"} else None

    status = await asyncio.to_thread(wait_for, listed, what="4 migrations listed")
    assert status["phase"] == "migrating", status["phase"]
    late = await _stream(pod.engine.url, "late", "late prompt", 10)
    assert late == [{"handed_back": True, "request_id": "late", "tokens": 0}], late

    drain = await asyncio.to_thread(httpx.get, f"{coordinator.url}/drain", timeout=60)
    summary = drain.json()
    assert summary["phase"] == "done", summary
    assert not summary_is_graceful(summary, pod.engine.pid)
    migration_deadline = status["drain"]["migration_deadline_at"]
    terminating = [t["at"] for t in summary["timeline"] if t["phase"] == "terminating"]
    assert terminating, summary["timeline"]
    assert terminating[0] >= migration_deadline, summary["timeline"]
    # Unacknowledged handoffs stay listed until the budget's end, then expire.
    final = await asyncio.to_thread(
        wait_for, lambda: (s := coordinator.status())["migrations"] == [] and s,
        what="pending migrations expired at the budget's end")
    assert final["migration_counts"]["expired"] == 5, final["migration_counts"]


async def test_coordinator_absent_when_the_engine_starts(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Start an engine whose coordinator is not up yet.
    2. The engine serves: a completion returns exactly the expected tokens.
    3. Start the coordinator on the address the engine was given.
    4. The engine registers on its own (background retries) and holds its event stream.
    5. A drain hands its stream back and ends with the tree gone gracefully, main exit 0."""
    port = free_port()
    # A stream of more than 5 tokens is held after 5 until handed back.
    knobs: dict[str, Any] = {**ENGINE, "coordinator": f"http://127.0.0.1:{port}",
                             "hold_after_tokens": 5}
    handle = start_engine(janitor.spawn, tmp_path / "records", **knobs)
    got = await _stream(handle.url, "before", "early prompt", 5)
    assert [sse.chunk_text(e) for e in got if isinstance(e, dict)] == expected_tokens(
        "early prompt", 5)
    assert got[-1] == sse.DONE

    coordinator = start_coordinator(janitor, tmp_path, *FAST, "--port", str(port))
    pod = Pod(handle, coordinator)
    await asyncio.to_thread(wait_for, lambda: registered(pod), what="late registration")

    warm = asyncio.Event()
    task = asyncio.create_task(_stream(handle.url, "during", "p", 200, warm))
    await asyncio.wait_for(warm.wait(), 60)
    drain = await asyncio.to_thread(httpx.get, f"{coordinator.url}/drain", timeout=60)
    events = await asyncio.wait_for(task, 30)
    last = events[-1]
    assert isinstance(last, dict), events[-2:]
    assert last.get("handed_back"), events[-2:]
    assert not summary_is_graceful(drain.json(), handle.pid)
    assert handle.proc.wait(timeout=30) == 0


async def test_sigterm_to_the_engine_drains_through_the_coordinator(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. 2 pods and the router; 16 streams; pod 0 holds its streams after 3 tokens.
    2. Once each has 3 tokens, SIGTERM pod 0's engine main process directly (no GET /drain).
    3. Pod 0's coordinator starts the same drain (its reason names the SIGTERM).
    4. Every stream completes exactly, pod 0's handed back and continued on pod 1 (none
       could finish on pod 0); the engine exits 0 after its own cleanup; the drain ends
       done."""
    pods = [start_pod(janitor, tmp_path, "pod0", hold_after_tokens=3),
            start_pod(janitor, tmp_path, "pod1")]
    janitor.service(pods[1].engine.proc)  # scenery: the janitor stops it at the end
    router = start_router(janitor, tmp_path, pods)
    load = Load(router, 16, 40)
    running = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), 60)
    coordinator = pods[0].coordinator
    assert coordinator is not None
    os.kill(pods[0].engine.pid, signal.SIGTERM)

    def drain_reason() -> str | None:
        drain = coordinator.status()["drain"]
        return str(drain["reason"]) if drain else None

    reason = await asyncio.to_thread(wait_for, drain_reason, what="drain started")
    assert "SIGTERM" in reason, reason
    streams = await asyncio.wait_for(running, 120)
    broken = [(s.prompt, len(s.tokens), s.error) for s in streams if not s.exact]
    assert not broken, broken
    stats = (await asyncio.to_thread(httpx.get, f"{router}/stats")).json()
    assert stats["handed_back"] >= 1, stats
    assert (stats["continued"], stats["failed"]) == (stats["handed_back"], 0), stats
    drain = await asyncio.to_thread(httpx.get, f"{coordinator.url}/drain", timeout=60)
    assert drain.json()["phase"] == "done", json.dumps(drain.json())[:500]
    assert pods[0].engine.proc.wait(timeout=30) == 0
