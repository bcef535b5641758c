"""The continuation proxy in front of the real routers (smg, vllm-router) over two simulated
engines: a stream an engine hands back mid-way is continued through the same router and
reaches the client whole and token-exact, completion and chat, streamed and collected.

The routers pass the handed-back event through unchanged (test_streaming.py); they continue
nothing themselves. The expected tokens are the engines' own (``expected_tokens``,
``chat_context``); which engine served what is the engines' own count.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.sim import EngineHandle, expected_tokens
from devstack.sim.chat_template import chat_context
from tests.continuation.stack import Proxy, start_proxy
from tests.continuation.test_proxy import MESSAGES, PROMPT, stream
from tests.routers.stack import ROUTERS, start_router
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.sim.openai_events import tokens_of
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("router_name", ROUTERS)]

TOKENS = 20
HOLD = 12
"""Both engines hold a stream after 12 tokens until it is handed back; the continuation
(8 tokens left) is short enough not to be held."""


def _proxied(router_name: str, janitor: ProcessJanitor, start_sim: StartEngine,
             tmp: Path) -> tuple[Proxy, list[EngineHandle]]:
    """Two engines, the router in front of them (round robin), the proxy in front of it."""
    engines = [start_sim(schedulers=1, token_interval_ms=1, hold_after_tokens=HOLD)
               for _ in range(2)]
    router = start_router(router_name, janitor, tmp, [e.url for e in engines])
    return start_proxy(janitor, tmp, router.url), engines


async def _hand_back_the_holder(engines: list[EngineHandle]) -> None:
    """Ask the engine that holds the stream (its own in-flight count) to hand it back."""

    def holder() -> EngineHandle | None:
        return next((e for e in engines
                     if httpx.get(f"{e.url}/health", timeout=10).json()["inflight"] == 1), None)

    engine = await asyncio.to_thread(wait_for, holder, what="an engine holding the stream")
    async with httpx.AsyncClient(timeout=30) as client:
        (await client.post(f"{engine.url}/internal/handoff")).raise_for_status()


def _handed_back(engines: list[EngineHandle]) -> int:
    return sum(httpx.get(f"{e.url}/health", timeout=10).json()["handed_back"] for e in engines)


@pytest.mark.parametrize(("path", "body", "context"), [
    ("/v1/completions", {"prompt": PROMPT}, PROMPT),
    ("/v1/chat/completions", {"messages": MESSAGES}, chat_context(MESSAGES)),
], ids=["completion", "chat"])
async def test_a_stream_handed_back_mid_way_arrives_whole_through_the_router(
    router_name: str, path: str, body: dict[str, Any], context: str,
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path,
) -> None:
    """1. Two engines, the router, the proxy in front of the router.
    2. Stream a 20-token request through the proxy; at its 12th token the engine holding
       it hands it back; the router passes the handed-back event on to the proxy.
    3. The proxy continues it through the router: the client gets exactly the engine's 20
       tokens for the prompt (or conversation), then [DONE], with one id.
    4. An engine handed a stream back (its own count); the proxy counts a hand-back and a
       continuation."""
    proxy, engines = _proxied(router_name, janitor, start_sim, tmp_path)

    async def on_chunk(n: int) -> None:
        if n == HOLD:
            await _hand_back_the_holder(engines)

    chunks, last = await stream(f"{proxy.url}{path}",
                                {"model": "sim", **body, "max_tokens": TOKENS}, on_chunk)
    assert tokens_of(chunks) == expected_tokens(context, TOKENS), proxy.log_text()
    assert last == "[DONE]"
    assert len({c["id"] for c in chunks}) == 1
    assert await asyncio.to_thread(_handed_back, engines) >= 1
    seen = proxy.metrics()
    assert seen["continuation_proxy_handed_back_total"] >= 1
    assert seen["continuation_proxy_continuations_total"] == 1


async def test_a_collected_chat_handed_back_mid_way_is_answered_whole(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Two engines, the router, the proxy.
    2. A 20-token chat, not streamed; once the proxy has 12 of its tokens, the engine
       holding it hands it back.
    3. The one answer's message is exactly the engine's 20 tokens for the conversation."""
    proxy, engines = _proxied(router_name, janitor, start_sim, tmp_path)
    async with httpx.AsyncClient(timeout=60) as client:
        answer = asyncio.ensure_future(client.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "sim", "messages": MESSAGES, "max_tokens": TOKENS}))
        await asyncio.to_thread(
            wait_for, lambda: proxy.metrics()["continuation_proxy_tokens_total"] >= HOLD,
            what="the proxy holding 12 tokens")
        await _hand_back_the_holder(engines)
        response = await answer
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["content"] == "".join(expected_tokens(chat_context(MESSAGES), TOKENS))
    assert proxy.metrics()["continuation_proxy_continuations_total"] == 1
