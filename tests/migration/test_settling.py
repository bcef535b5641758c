"""The migrating phase waits for a real engine's report, with the default --min-drain 0."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from devstack.sim.tokens import expected_tokens
from router_client import sse
from tests.migration.stack import start_pod, summary_is_graceful
from tests.support.processes import ProcessJanitor, wait_for

STREAMS = 4


async def _stream(url: str, request_id: str, prompt: str, warm: asyncio.Event,
                  ) -> list[dict[str, Any] | str]:
    got: list[dict[str, Any] | str] = []
    body = {"prompt": prompt, "max_tokens": 400, "stream": True}
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id}
    ) as resp:
        async for event in sse.events(resp.aiter_lines()):
            got.append(event)
            if len(got) == 2:
                warm.set()
    return got


async def test_terminating_waits_for_the_engines_zero_inflight_report(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. One pod (coordinator with the default --min-drain 0, engine with worker_client);
       4 streams straight to the engine, each with 2 tokens.
    2. POST /drain wait=false.
    3. Each stream ends with the handed-back event; the engine reports the 4 handoffs with
       its in-flight count: /status lists them, the worker shows inflight 0 and no longer
       awaits a report, and the phase is still migrating (terminating has not begun).
    4. The test, as a router, acknowledges the 4 handoffs.
    5. The drain ends done, gracefully; in its timeline terminating comes after every
       handoff's handed_back_at (the coordinator's own clock) and before the migration
       deadline."""
    # Streams wait after 2 tokens for their hand-back: the drain lands mid-stream however
    # slow the machine (400 tokens would otherwise be a 16 s window).
    pod = start_pod(janitor, tmp_path, "pod", hold_after_tokens=2)
    coordinator = pod.coordinator
    assert coordinator is not None
    warm = [asyncio.Event() for _ in range(STREAMS)]
    tasks = [asyncio.create_task(_stream(pod.engine.url, f"r{i}", f"p{i}", warm[i]))
             for i in range(STREAMS)]
    for event in warm:
        await asyncio.wait_for(event.wait(), 60)
    started = await asyncio.to_thread(
        httpx.post, f"{coordinator.url}/drain", json={"wait": False}, timeout=30)
    assert started.status_code == 202

    for i, events in enumerate(await asyncio.wait_for(asyncio.gather(*tasks), 60)):
        last = events[-1]
        assert isinstance(last, dict), events[-2:]
        assert last.get("handed_back"), events[-2:]
        texts = [sse.chunk_text(e) for e in events[:-1] if isinstance(e, dict)]
        assert texts == expected_tokens(f"p{i}", last["tokens"])

    def listed() -> dict[str, Any] | None:
        status = coordinator.status()
        return status if len(status["migrations"]) == STREAMS else None

    status = await asyncio.to_thread(wait_for, listed, what="4 handoffs listed")
    assert status["phase"] == "migrating", status["timeline"]
    (worker,) = status["workers"]
    assert (worker["inflight"], worker["awaiting_report"]) == (0, False), worker
    handed_back_at = max(m["handed_back_at"] for m in status["migrations"])
    ids = [m["request_id"] for m in status["migrations"]]
    with coordinator.client() as client:
        assert client.post("/migrations/ack", json={"request_ids": ids}).json()["acked"] == ids
    drain = await asyncio.to_thread(httpx.get, f"{coordinator.url}/drain", timeout=60)
    summary = drain.json()
    assert summary["phase"] == "done", summary["timeline"]
    assert not summary_is_graceful(summary, pod.engine.pid)
    terminating = next(t["at"] for t in summary["timeline"] if t["phase"] == "terminating")
    assert handed_back_at <= terminating < summary["drain"]["migration_deadline_at"]
