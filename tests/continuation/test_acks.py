"""The proxy acknowledges a handoff to the coordinator of the pod that handed it back, which
the proxy knows only by URL: the pod's drain then ends without waiting for its migration
deadline, graceful, with nothing lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from devstack.sim import expected_tokens
from tests.continuation.stack import start_proxy, start_round_robin
from tests.continuation.test_proxy import HOLD, PROMPT, TOKENS, stream
from tests.migration.stack import start_pod
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.sim.openai_events import tokens_of
from tests.support.processes import ProcessJanitor


@pytest.mark.parametrize("told", ["by URL", "by DNS"])
async def test_the_handoff_is_acknowledged_to_the_draining_pods_coordinator(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path, told: str
) -> None:
    """1. Pod A: a coordinator and an engine registered with it, holding its streams after
       4 tokens. Engine B without a coordinator. The round-robin router over both; the
       proxy in front of it, told of A's coordinator (and of no pod): by its URL, or by a
       name (``--coordinators-dns localhost:PORT``: every address of ``localhost``, of
       which only 127.0.0.1 answers, as a headless Service lists pods that are gone).
    2. Stream a 20-token completion through the proxy; it goes to A; at its 4th token,
       drain pod A (POST /drain, wait=false): A's engine hands the stream back.
    3. The client gets exactly the engine's 20 tokens and [DONE] (B continued it).
    4. The drain ends graceful: the one handoff acknowledged, none expired; the proxy
       counts one acknowledgement."""
    pod = start_pod(janitor, tmp_path, "a", token_interval_ms=1, hold_after_tokens=HOLD)
    assert pod.coordinator is not None
    coordinator = pod.coordinator.url
    b = start_sim(schedulers=1, token_interval_ms=1)
    router = start_round_robin(janitor, tmp_path, [pod.engine.url, b.url])
    port = urlsplit(coordinator).port
    proxy = start_proxy(janitor, tmp_path, router, *(
        ["--coordinator", coordinator] if told == "by URL"
        else ["--coordinators-dns", f"localhost:{port}", "--dns-interval", "0.2"]))

    async def drain(n: int) -> None:
        if n == HOLD:
            async with httpx.AsyncClient(timeout=30) as client:
                started = await client.post(f"{coordinator}/drain", json={"wait": False})
                assert started.status_code == 202, started.text

    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS},
                                drain)
    assert tokens_of(chunks) == expected_tokens(PROMPT, TOKENS), proxy.log_text()
    assert last == "[DONE]"
    summary: dict[str, Any] = (await asyncio.to_thread(
        httpx.get, f"{coordinator}/drain", timeout=60)).json()
    assert summary["outcome"] == "graceful", summary
    status = await asyncio.to_thread(pod.coordinator.status)
    counts = status["migration_counts"]
    assert (counts["handed_back"], counts["acked"], counts["expired"]) == (1, 1, 0), counts
    assert proxy.metrics()["continuation_proxy_acked_total"] == 1
