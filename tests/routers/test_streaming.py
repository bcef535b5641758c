"""Real routers (smg, vllm-router) in front of simulated engines: every stream arrives whole
and token-exact, and every engine gets its share.

The expected tokens come from the engines' own deterministic source (``expected_tokens``,
``chat_context``); which engine served what comes from the engines' own counts (``/health``
``completed``), never from the router.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from devstack.sim import EngineHandle, expected_tokens
from devstack.sim.chat_template import chat_context
from tests.routers.stack import ROUTERS, Router, start_router
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.sim.openai_events import Last, read_chunks, tokens_of
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("router_name", ROUTERS)]

ENGINES = 3
STREAMS = 6
TOKENS = 24
CLIENT_TIMEOUT_S = 30.0


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[
        list[str], Last]:
    """POST a streaming request; the tokens in order and the last event."""
    async with client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        chunks, last = await read_chunks(response)
    return tokens_of(chunks), last


def _start(start_sim: StartEngine, count: int = ENGINES, **knobs: Any) -> list[EngineHandle]:
    return [start_sim(schedulers=1, token_interval_ms=1, **knobs) for _ in range(count)]


def _served(engines: list[EngineHandle]) -> list[int]:
    """Requests each engine completed, by its own count."""
    return [httpx.get(f"{e.url}/health", timeout=5).json()["completed"] for e in engines]


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Answer in made-up words."},
            {"role": "user", "content": f"Question {i}: what drains a pod?"}]


async def _streams_on_every_engine(
    router: Router, engines: list[EngineHandle], path: str,
    requests: list[tuple[dict[str, Any], str]],
) -> dict[str, Any]:
    """Stream every ``(body, context)`` through the router at once: each stream is the
    engine's tokens for ``context`` and ends with [DONE]. Then the first body once more,
    5 tokens without streaming (returned). Every engine served some, all of them in all."""
    url = f"{router.url}{path}"
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
        results = await asyncio.gather(*(
            _stream(client, url, {"model": "sim", **body, "max_tokens": TOKENS})
            for body, _ in requests))
        whole = await client.post(url, json={"model": "sim", **requests[0][0],
                                             "max_tokens": 5})
    for (_, context), (tokens, last) in zip(requests, results, strict=True):
        assert tokens == expected_tokens(context, TOKENS), router.log_tail()
        assert last == "[DONE]"
    assert whole.status_code == 200, whole.text
    served = _served(engines)
    assert all(n > 0 for n in served), served
    assert sum(served) == len(requests) + 1, served
    body: dict[str, Any] = whole.json()
    return body


async def test_completion_streams_arrive_whole_on_every_engine(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Any
) -> None:
    """1. Start three simulated engines and the router in front of them (round robin).
    2. Stream six completions through the router at once, each its own prompt.
    3. Each stream is exactly the engine's tokens for its prompt and ends with [DONE].
    4. One completion without streaming: the whole text.
    5. Every engine served some of them, and they served seven in all (their own counts)."""
    engines = _start(start_sim)
    router = start_router(router_name, janitor, tmp_path, [e.url for e in engines])
    prompts = [f"Prompt {i}: explain graceful shutdown" for i in range(STREAMS)]
    whole = await _streams_on_every_engine(router, engines, "/v1/completions",
                                           [({"prompt": p}, p) for p in prompts])
    assert whole["choices"][0]["text"] == "".join(expected_tokens(prompts[0], 5))


async def test_chat_streams_arrive_whole_on_every_engine(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Any
) -> None:
    """1. Start three simulated engines and the router in front of them (round robin).
    2. Stream six chat completions through the router at once, each its own conversation.
    3. Each stream is exactly the engine's tokens for the conversation's chat context and
       ends with [DONE].
    4. One chat completion without streaming: the whole assistant message.
    5. Every engine served some of them, and they served seven in all (their own counts)."""
    engines = _start(start_sim)
    router = start_router(router_name, janitor, tmp_path, [e.url for e in engines])
    whole = await _streams_on_every_engine(
        router, engines, "/v1/chat/completions",
        [({"messages": _messages(i)}, chat_context(_messages(i))) for i in range(STREAMS)])
    assert whole["choices"][0]["message"] == {
        "role": "assistant", "content": "".join(expected_tokens(chat_context(_messages(0)), 5))}


async def test_chat_continued_through_the_router_is_the_rest_of_the_stream(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Any
) -> None:
    """1. Start two simulated engines and the router.
    2. Stream a 20-token chat answer; keep its first 8 tokens.
    3. Send the conversation again with those 8 tokens as an open assistant message
       (continue_final_message, no generation prompt) for 12 tokens, twice, so both
       engines answer one.
    4. Each continuation is exactly tokens 9-20 of the first stream."""
    engines = _start(start_sim, count=2)
    router = start_router(router_name, janitor, tmp_path, [e.url for e in engines])
    url = f"{router.url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
        first, _ = await _stream(client, url, {"model": "sim", "messages": _messages(1),
                                               "max_tokens": 20})
        partial = [*_messages(1), {"role": "assistant", "content": "".join(first[:8])}]
        body = {"model": "sim", "messages": partial, "max_tokens": 12,
                "continue_final_message": True, "add_generation_prompt": False}
        continued = [await _stream(client, url, body) for _ in range(2)]
    assert first == expected_tokens(chat_context(_messages(1)), 20)
    for tokens, last in continued:
        assert tokens == first[8:], router.log_tail()
        assert last == "[DONE]"
    assert all(n > 0 for n in _served(engines))


async def test_a_handed_back_stream_reaches_the_client_as_the_engine_ended_it(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Any
) -> None:
    """1. Start two simulated engines whose streams wait after 4 tokens for a hand-back,
    and the router.
    2. Stream a 20-token completion through the router; once it has 4 tokens, ask every
       engine to hand its requests back.
    3. The client sees the 4 tokens, then the engine's handed-back event (request id, 4
       tokens) and no [DONE]: the router passes it through, which is what lets a
       continuation layer in front of it pick the stream up."""
    engines = _start(start_sim, count=2, hold_after_tokens=4)
    router = start_router(router_name, janitor, tmp_path, [e.url for e in engines])
    prompt = "Prompt: a stream a drain interrupts"
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
        reading = asyncio.ensure_future(_stream(
            client, f"{router.url}/v1/completions",
            {"model": "sim", "prompt": prompt, "max_tokens": 20}))
        await _held_stream(engines, reading)
        for engine in engines:
            await client.post(f"{engine.url}/internal/handoff")
        tokens, last = await reading
    assert tokens == expected_tokens(prompt, 4), router.log_tail()
    assert isinstance(last, dict), last
    assert last["handed_back"] is True
    assert last["tokens"] == 4


async def _held_stream(engines: list[EngineHandle], reading: asyncio.Future[Any]) -> None:
    """Wait (off the event loop, which keeps reading) until one engine holds the stream."""

    def held() -> bool:
        if reading.done():
            raise AssertionError(f"the stream ended before it was held: {reading.result()}")
        inflight: int = sum(httpx.get(f"{e.url}/health", timeout=5).json()["inflight"]
                            for e in engines)
        return inflight == 1

    await asyncio.to_thread(wait_for, held, what="an engine holding the stream")
