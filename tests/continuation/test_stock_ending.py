"""``--end-streams``: a drain ends a stock engine's streams through the engine's own abort call
once the router took the pod out, and the proxy in front continues them on another engine.

The engine is the simulated one, logging each request it takes and how it ended (its own
record, ``devstack.logged_engine``), with SGLang's ``POST /abort_request``: its aborted
stream ends with a chunk whose ``finish_reason`` is ``abort`` and ``[DONE]``, as SGLang's does
(tests/engines/test_stock_ending.py holds the real SGLang and vLLM). It never registers:
the coordinator adopts it with SGLang's profile, reads its in-flight gauges and ends its
streams. The router is the round-robin one, taken out of by the coordinator's vllm-router
adapter (``POST /remove_worker``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.logged_engine import logged_argv
from devstack.sim import expected_tokens
from devstack.sim.launcher import EngineHandle, start_engine
from devstack.sim.records import read_requests
from tests.continuation.stack import Proxy, start_proxy, start_round_robin
from tests.continuation.test_proxy import HOLD, PROMPT, TOKENS, stream
from tests.service.servers import FAST, Running, start_coordinator
from tests.sim.openai_events import tokens_of
from tests.support.processes import ProcessJanitor, wait_for

GRACE = ["--grace-period", "60", "--tier-timeout", "20"]
"""Room for SGLang's profile (its main process keeps 15 s for its exit) and for the
simulated engine's own exit on a loaded machine."""


@dataclass
class Stack:
    a: EngineHandle
    """Holds its streams after HOLD tokens, adopted by ``coordinator``."""
    b: EngineHandle
    router: str
    coordinator: Running
    proxy: Proxy


@pytest.fixture
def engines() -> Iterator[list[EngineHandle]]:
    """The engines a test started; each still running gets SIGTERM at its end (it stops
    its tree and exits), before the janitor sweeps."""
    started: list[EngineHandle] = []
    yield started
    for engine in started:
        if engine.proc.poll() is None:
            os.kill(engine.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.proc.wait(timeout=30)


def logged_engine(janitor: ProcessJanitor, tmp: Path, name: str, **knobs: Any) -> EngineHandle:
    def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (tmp / f"{name}.log").open("ab")
        try:
            return janitor.spawn(logged_argv(argv), env=env, stdout=log,
                                 stderr=subprocess.STDOUT)
        finally:
            log.close()

    return start_engine(spawn, tmp / f"{name}-records", schedulers=1, token_interval_ms=1,
                        graceful_main=True, **knobs)


def start_stack(janitor: ProcessJanitor, tmp: Path, engines: list[EngineHandle]) -> Stack:
    a = logged_engine(janitor, tmp, "a", hold_after_tokens=HOLD)
    b = logged_engine(janitor, tmp, "b")
    engines += [a, b]
    router = start_round_robin(janitor, tmp, [a.url, b.url])
    coordinator = start_coordinator(
        janitor, tmp, *FAST, *GRACE, "--engine", "sglang", "--end-streams",
        # This engine alone (the profile's patterns would match any SGLang on the machine).
        "--adopt-pattern", re.escape(str(a.record_dir)), "--engine-url", a.url,
        "--engine-metrics-url", f"{a.url}/metrics",
        "--router", f"vllm-router={router}", "--router-worker-url", a.url, "--no-router-join")
    wait_for(lambda: [r["pid"] for r in coordinator.status()["adopted"]] == [a.pid],
             what="the coordinator adopts engine A")
    proxy = start_proxy(janitor, tmp, router, "--coordinator", coordinator.url)
    return Stack(a, b, router, coordinator, proxy)


async def drain_at(coordinator: Running, n: int) -> None:
    if n == HOLD:
        async with httpx.AsyncClient(timeout=30) as client:
            started = await client.post(f"{coordinator.url}/drain", json={"wait": False})
            assert started.status_code == 202, started.text


def summary(coordinator: Running) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{coordinator.url}/drain", timeout=120).json()
    return answer


def how_each_ended(engine: EngineHandle) -> list[tuple[int, str | None, str]]:
    """(tokens, how, prompt) of every request the engine took, by its own log."""
    return [(r["tokens"], r["how"], r["prompt"]) for r in read_requests(engine.record_dir)]


async def test_a_stream_the_drain_ends_is_continued_and_counted_handed_to_the_proxy(
    janitor: ProcessJanitor, tmp_path: Path, engines: list[EngineHandle]
) -> None:
    """1. Engine A (held after HOLD tokens) and B behind the round-robin router; A adopted by
       a coordinator with SGLang's profile and ``--end-streams``; the proxy watching it.
    2. A 20-token completion through the proxy lands on A; at its HOLD-th token the pod is
       drained: the adapter takes A out of the router, then the coordinator calls A's
       ``/abort_request``: A ends the stream with its next token, finishing ``abort``.
    3. The client gets exactly the engine's 20 tokens and ``[DONE]``: B continued it from
       the HOLD + 1 tokens A streamed, by A's and B's own logs.
    4. The summary: one stream ended, one taken over by the proxy, none cut or lost, a
       graceful drain; the proxy counts the stream ended and acknowledged."""
    s = start_stack(janitor, tmp_path, engines)
    chunks, last = await stream(f"{s.proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS},
                                lambda n: drain_at(s.coordinator, n))
    assert tokens_of(chunks) == expected_tokens(PROMPT, TOKENS), s.proxy.log_text()
    assert last == "[DONE]"
    streamed = "".join(expected_tokens(PROMPT, TOKENS)[:HOLD + 1])
    assert how_each_ended(s.a) == [(HOLD + 1, "aborted", PROMPT)]
    assert how_each_ended(s.b) == [(TOKENS - HOLD - 1, "done", PROMPT + streamed)]

    result = await asyncio.to_thread(summary, s.coordinator)
    drain = result["last_drain"] or result["drain"]
    assert result["outcome"] == "graceful", result
    assert (drain["ended_requests"], drain["continued_requests"], drain["cut_requests"],
            drain["lost_requests"]) == (1, 1, 0, 0), drain
    assert result["stream_ending"]["state"] == "closed", result["stream_ending"]
    metrics = s.proxy.metrics()
    assert metrics["continuation_proxy_ended_total"] == 1
    assert metrics["continuation_proxy_ended_acked_total"] == 1
    assert metrics["continuation_proxy_completed_total"] == 1


async def test_an_ended_stream_nobody_continues_is_counted_cut(
    janitor: ProcessJanitor, tmp_path: Path, engines: list[EngineHandle]
) -> None:
    """The client talks to the router itself (no proxy in front): the stream the drain ends
    reaches it finished ``abort`` after HOLD + 1 tokens, nobody takes it over, and once the
    window closes the summary counts it ended and cut, a lost request, by A's own log."""
    s = start_stack(janitor, tmp_path, engines)
    chunks, last = await stream(f"{s.router}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS},
                                lambda n: drain_at(s.coordinator, n))
    assert last == "[DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert how_each_ended(s.a) == [(HOLD + 1, "aborted", PROMPT)]
    assert how_each_ended(s.b) == []

    result = await asyncio.to_thread(summary, s.coordinator)
    drain = result["last_drain"] or result["drain"]
    assert (drain["ended_requests"], drain["continued_requests"], drain["cut_requests"],
            drain["lost_requests"]) == (1, 0, 1, 1), drain
    assert result["outcome"] != "graceful", result


async def test_an_abort_no_drain_asked_for_is_passed_on_as_it_came(
    janitor: ProcessJanitor, tmp_path: Path, engines: list[EngineHandle]
) -> None:
    """A's own ``/abort_request`` while no drain runs (a client's, an operator's): the proxy
    waits for a drain's window that never opens, then passes the stream's end on as the
    engine sent it; nothing is continued on B."""
    s = start_stack(janitor, tmp_path, engines)

    async def abort_at(n: int) -> None:
        if n == HOLD:
            async with httpx.AsyncClient(timeout=30) as client:
                (await client.post(f"{s.a.url}/abort_request",
                                   json={"abort_all": True})).raise_for_status()

    chunks, last = await stream(f"{s.proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS},
                                abort_at)
    assert last == "[DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert tokens_of(chunks) == expected_tokens(PROMPT, TOKENS)[:HOLD + 1]
    assert how_each_ended(s.a) == [(HOLD + 1, "aborted", PROMPT)]
    assert how_each_ended(s.b) == []
    assert s.proxy.metrics()["continuation_proxy_ended_total"] == 0
    wait_for(lambda: s.coordinator.status()["phase"] == "serving", what="still serving")
