"""Stock SGLang and stock vLLM migrated through the proxy (``--end-streams``): a long stream
(``TOKENS``) in flight on a stock engine behind vllm-router is ended by the drain through the
engine's own abort call, continued on a second real engine of the same kind through the
continuation proxy, and arrives whole, token for token.

Ground truth: the client's token ids against what the peer generates whole for the same
request (greedy, the same dummy weights: two servers give the same tokens); the engines' own
counts (SGLang's ``sglang:num_aborted_requests_total``, vLLM's "Aborted request" lines of
``--enable-log-requests``, each engine's request counter) for what was ended and where the
continuation ran; the proxy's own metrics for what it continued. The drain's summary must
match all of them. Timing (the pod empty against waiting for the stream) is measured in
``bench/stock_ending.py``, not asserted here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from devstack import routers
from tests.continuation.stack import start_proxy
from tests.engines.sglang_stack import Stream, completion_body, start_stream
from tests.engines.stack import start_coordinator
from tests.engines.stock_stack import STARTERS, finished
from tests.engines.tiny_model import prompt
from tests.routers.stack import janitor_spawn, router_binary
from tests.support.cpu_quota import Quota, cpu_quota
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

TOKENS = {"sglang": 6000, "vllm": 16000}
"""Each stream's length: still in flight when the drain ends it, however fast the engine
and however slow the steps between the stream's start and the drain (the peer put back into
the router, which checks its ``/health`` first: 1 to 3 s here on a busy machine, longer on
a slower one). vLLM streams the tiny model at 90 to 280 tokens a second under load here and
about 1,000 on an idle machine: 1,000- and 3,000-token streams finished before the drain had
taken the pod out of the router under load, a 12,000-token one when idle (the step then
reads nothing in flight and ends nothing). 16,000 is the most the tiny model's context
(16,384) holds. SGLang streamed it at about 250 tokens a second idle: a 1,000-token stream
(4 s) once ended whole before the drain reached it; 6,000 fits its 8,192-token pool."""
ROUTER = "vllm-router"
"""It passes a token-id prompt on: the continuation is token-exact."""
STARTED_CHUNKS = 10
"""Chunks the client has before the drain starts: the stream is under way."""


QUOTA_CPUS = {"vllm": 0.5}
"""The drained engine's CPU limit (its whole tree, as a pod's): idle, vLLM streamed the tiny
model at about 1,100 tokens a second, and a 16,000-token stream ended before a drain that
started 12 s after it; a process spinning on its core instead slowed it, and starved the
coordinator, the proxy and the peer beside it on 2 cores (the proxy's acknowledgement came
after the ending window). SGLang's 6,000 tokens last long enough unlimited."""


@pytest.fixture
def quotas() -> Iterator[contextlib.ExitStack]:
    """CPU limits the test puts on processes, removed when it ends (before the janitor ends
    the processes)."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def scenery() -> Iterator[ProcessJanitor]:
    """Starts the peer, which nothing drains: ended with the test, however it ends (stock
    SGLang SIGKILLs its own children on SIGTERM)."""
    janitor = ProcessJanitor()
    try:
        yield janitor
    finally:
        janitor.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_stock_stream_the_drain_ends_is_continued_whole_on_the_peer(
    engine: str, janitor: ProcessJanitor, scenery: ProcessJanitor, quotas: contextlib.ExitStack,
    tmp_path: Path, tiny_model: Path,
) -> None:
    """1. Two stock engines of one kind, the peer and the drained one; what the peer
       generates whole for a long completion (its token ids).
    2. vllm-router in front of the peer; the drained engine's coordinator (its profile,
       ``--end-streams``, the router's adapter) adds it to the router; the proxy in front of
       the router, watching that coordinator.
    3. With the peer taken out of the router for a moment, the stream goes to the drained
       engine; once the peer is back and the stream is under way, GET /drain.
    4. The client's stream ends with [DONE], its token ids exactly the peer's.
    5. The drained engine aborted one request (its own count), the peer served the
       continuation (its own count), the proxy continued one ended stream and had it
       counted; the summary says one ended, one continued, none cut, none lost."""
    router_binary(ROUTER)
    start = STARTERS[engine]
    peer = start(scenery, tmp_path, tiny_model, "peer")
    body = completion_body(peer.model, prompt(6), TOKENS[engine])
    whole = httpx.post(peer.url + "/v1/completions", json=body, timeout=600).json()
    expected: list[int] = whole["choices"][0]["token_ids"]
    assert len(expected) == TOKENS[engine]

    drained = start(janitor, tmp_path, tiny_model, "drained")
    front = routers.start_router(ROUTER, janitor_spawn(janitor), tmp_path, [peer.url])
    coordinator = start_coordinator(
        janitor, tmp_path, "--engine", engine, "--end-streams", "--grace-period", "120",
        "--adopt-pattern", drained.pattern, "--engine-url", drained.url,
        "--engine-metrics-url", drained.url + "/metrics", "--scan-interval", "0.5",
        "--router", f"{ROUTER}={front.url}", "--router-worker-url", drained.url)
    wait_for(lambda: [a["pid"] for a in coordinator.status()["adopted"]] == [drained.pid],
             timeout=60, what="the coordinator adopts the drained engine")
    wait_for(lambda: front.routes_to(drained.url), timeout=120,
             what="the router routes to the drained engine")
    proxy = start_proxy(janitor, tmp_path, front.url, "--coordinator", coordinator.url)

    peer_before = len(finished(engine, peer))
    quota: Quota | None = None
    if engine in QUOTA_CPUS:
        tree = [drained.pid, *(c.pid for c in psutil.Process(drained.pid).children(True))]
        quota = quotas.enter_context(cpu_quota(tree, QUOTA_CPUS[engine]))
    front.remove_worker(peer.url)
    stream: Stream = start_stream(proxy.url + "/v1/completions", {**body, "stream": True},
                                  {"X-Request-Id": "stock-1"})
    wait_for(lambda: stream.chunks >= STARTED_CHUNKS or stream.ended.is_set(), timeout=300,
             what="the stream under way")
    front.add_worker(peer.url)
    with coordinator.client(timeout=300) as client, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.get, "/drain")
        # The limit only keeps the stream in flight until the drain ends it: lifted then,
        # the engine shuts down at its own pace.
        wait_for(lambda: stream.ended.is_set() or any(
            line.endswith("abort") for line in finished(engine, drained)), timeout=300,
            what="the drained engine ends the stream")
        if quota is not None:
            quota.lift()
        summary: dict[str, Any] = answer.result(timeout=300).json()
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=1))
    assert stream.ended.wait(timeout=300)

    assert stream.whole, stream.error
    assert stream.tokens == expected
    drained_log = finished(engine, drained)
    wait_for(lambda: len(finished(engine, peer)) > peer_before, timeout=60,
             what=f"the peer logs the continuation (the drained engine's log: {drained_log}; "
                  f"the drain's stream ending: {summary['stream_ending']})")
    peer_log = finished(engine, peer)[peer_before:]
    if engine == "sglang":
        assert drained_log == ["abort"], drained_log
        assert peer_log == ["length"], peer_log
    else:  # vLLM's ids are the proxy's attempts (X-Request-Id through vllm-router)
        assert drained_log == ["cmpl-stock-1.0 abort"], drained_log
        assert peer_log == ["cmpl-stock-1.1"], peer_log
    metrics = proxy.metrics()
    assert metrics["continuation_proxy_ended_total"] == 1
    assert metrics["continuation_proxy_ended_acked_total"] == 1
    drain = summary["drain"] or summary["last_drain"]
    assert (drain["ended_requests"], drain["continued_requests"], drain["cut_requests"],
            drain["lost_requests"]) == (1, 1, 0, 0), drain
    assert summary["stream_ending"]["state"] == "closed", summary["stream_ending"]
