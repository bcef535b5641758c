"""The continuation proxy in front of a small round-robin router over simulated engines: a
stream an engine hands back mid-way reaches the client whole, streamed or collected,
completion or chat; what cannot be continued exactly is refused and says why.

The expected tokens are the engines' own (``expected_tokens``, ``chat_context``); where the
requests went is the engines' own count (``/health``). Engine A holds every stream after
``HOLD`` tokens until it is handed back, so each hand-back lands mid-way without racing
the token clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from devstack.sim import EngineHandle, expected_tokens
from devstack.sim.chat_template import chat_context
from tests.continuation.stack import Proxy, start_proxy, start_round_robin, start_scripted
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.sim.openai_events import Last, read_chunks, tokens_of
from tests.support.processes import ProcessJanitor, wait_for

HOLD = 4
TOKENS = 20
PROMPT = "Prompt: a stream a drain interrupts"
MESSAGES = [{"role": "system", "content": "Answer in made-up words."},
            {"role": "user", "content": "What drains a pod?"}]
RELAY = Path(__file__).parents[1] / "support" / "tcp_relay.py"
OnChunk = Callable[[int], Awaitable[None]]


async def stream(url: str, body: dict[str, Any], on_chunk: OnChunk | None = None
                 ) -> tuple[list[dict[str, Any]], Last]:
    """POST a streaming request; its chunks and its last event (``""`` when it ended
    without ``[DONE]``: an error event is then the last chunk)."""
    async with httpx.AsyncClient(timeout=60) as client, client.stream(
            "POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        return await read_chunks(response, on_chunk)


def hand_back_at(engine: EngineHandle, tokens: int = HOLD) -> OnChunk:
    """An ``on_chunk`` that asks ``engine`` to hand its requests back once the client has
    ``tokens`` chunks (the engine holds the stream there)."""

    async def on_chunk(n: int) -> None:
        if n == tokens:
            async with httpx.AsyncClient(timeout=30) as client:
                (await client.post(f"{engine.url}/internal/handoff")).raise_for_status()

    return on_chunk


def health(engine: EngineHandle) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{engine.url}/health", timeout=10).json()
    return answer


def two_engines(start_sim: StartEngine) -> tuple[EngineHandle, EngineHandle]:
    """Engine A holds its streams after HOLD tokens; engine B streams freely."""
    return (start_sim(schedulers=1, token_interval_ms=1, hold_after_tokens=HOLD),
            start_sim(schedulers=1, token_interval_ms=1))


def proxy_over(janitor: ProcessJanitor, tmp: Path, engines: list[str], *args: str) -> Proxy:
    return start_proxy(janitor, tmp, start_round_robin(janitor, tmp, engines), *args)


def one_stream(chunks: list[dict[str, Any]]) -> None:
    """Every chunk has the first chunk's id and created."""
    assert {(c["id"], c["created"]) for c in chunks} == {(chunks[0]["id"],
                                                          chunks[0]["created"])}


async def test_a_completion_handed_back_mid_way_arrives_whole(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Engines A (holds after 4 tokens) and B behind the round-robin router, the proxy
       in front of it.
    2. Stream a 20-token completion through the proxy; it goes to A; at its 4th token A
       hands it back.
    3. The client gets exactly the engine's 20 tokens for the prompt, then [DONE], as one
       stream (one id and created).
    4. A handed one request back, B completed one (their counts); the proxy counts one
       hand-back and one continuation."""
    a, b = two_engines(start_sim)
    proxy = proxy_over(janitor, tmp_path, [a.url, b.url])
    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS},
                                hand_back_at(a))
    assert tokens_of(chunks) == expected_tokens(PROMPT, TOKENS), proxy.log_text()
    assert last == "[DONE]"
    one_stream(chunks)
    assert (health(a)["handed_back"], health(b)["completed"]) == (1, 1)
    seen = proxy.metrics()
    assert seen["continuation_proxy_handed_back_total"] == 1
    assert seen["continuation_proxy_continuations_total"] == 1
    assert seen["continuation_proxy_completed_total"] == 1


async def test_a_chat_handed_back_mid_way_arrives_whole(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. As above, a chat of 20 tokens handed back by A at its 4th token.
    2. The client gets exactly the engine's 20 tokens for the conversation, then [DONE],
       one stream, and ``role`` only in its first chunk (the continuation does not open a
       second message)."""
    a, b = two_engines(start_sim)
    proxy = proxy_over(janitor, tmp_path, [a.url, b.url])
    chunks, last = await stream(f"{proxy.url}/v1/chat/completions",
                                {"model": "sim", "messages": MESSAGES, "max_tokens": TOKENS},
                                hand_back_at(a))
    assert tokens_of(chunks) == expected_tokens(chat_context(MESSAGES), TOKENS)
    assert last == "[DONE]"
    one_stream(chunks)
    roles = [i for i, c in enumerate(chunks) if "role" in c["choices"][0]["delta"]]
    assert roles == [0]
    assert (health(a)["handed_back"], health(b)["completed"]) == (1, 1)


async def _collected(proxy: Proxy, engine: EngineHandle, path: str,
                     body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` unstreamed; once the proxy has HOLD tokens of it (its own counter: the
    engine holds the stream there), ``engine`` hands it back. The answer's JSON."""
    async with httpx.AsyncClient(timeout=60) as client:
        answer = asyncio.ensure_future(client.post(f"{proxy.url}{path}", json=body))

        def held() -> bool:
            if answer.done():
                raise AssertionError(f"answered before the hand-back: {answer.result().text}")
            return proxy.metrics()["continuation_proxy_tokens_total"] >= HOLD

        await asyncio.to_thread(wait_for, held, what="the proxy holding 4 tokens")
        (await client.post(f"{engine.url}/internal/handoff")).raise_for_status()
        response = await answer
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_unstreamed_requests_handed_back_are_answered_whole(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Engines A and B, the router, the proxy.
    2. A completion of 20 tokens, not streamed, handed back by A after 4 tokens: the one
       answer holds the engine's 20 tokens.
    3. A chat the same way: the one assistant message holds them, and the usage counts 20
       completion tokens and the conversation's own prompt (words, the engine's count)."""
    a, b = two_engines(start_sim)
    proxy = proxy_over(janitor, tmp_path, [a.url, b.url])
    completion = await _collected(proxy, a, "/v1/completions",
                                  {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS})
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == "".join(expected_tokens(PROMPT, TOKENS))
    (await asyncio.to_thread(httpx.post, f"{a.url}/internal/resume")).raise_for_status()
    chat = await _collected(proxy, a, "/v1/chat/completions",
                            {"model": "sim", "messages": MESSAGES, "max_tokens": TOKENS})
    context = chat_context(MESSAGES)
    assert chat["choices"][0]["message"] == {
        "role": "assistant", "content": "".join(expected_tokens(context, TOKENS))}
    assert chat["usage"]["completion_tokens"] == TOKENS
    assert chat["usage"]["prompt_tokens"] == len(context.split())
    assert proxy.metrics()["continuation_proxy_continuations_total"] == 2


async def test_several_choices_are_refused_and_counted(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Engines A and B, the router, the proxy.
    2. Stream a completion with n=2 (the simulated engine gives one choice); A hands it
       back after 4 tokens.
    3. The client gets those 4 tokens, then an error event whose code is ``n``, and no
       [DONE]; nothing was sent to B; the proxy counts one refusal for ``n``."""
    a, b = two_engines(start_sim)
    proxy = proxy_over(janitor, tmp_path, [a.url, b.url])
    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS,
                                 "n": 2}, hand_back_at(a))
    assert last == ""
    *tokens, error = chunks
    assert tokens_of(tokens) == expected_tokens(PROMPT, HOLD)
    assert error["error"]["code"] == "n"
    assert error["error"]["type"] == "continuation_refused"
    assert health(b)["completed"] == 0
    assert health(b)["inflight"] == 0
    assert proxy.metrics()['continuation_proxy_refused_total{reason="n"}'] == 1


async def test_a_tool_call_in_progress_is_refused(janitor: ProcessJanitor,
                                                  tmp_path: Path) -> None:
    """1. The proxy in front of an upstream that streams a tool call and hands it back
       mid-call.
    2. The client gets the chunks before the hand-back, then an error event whose code
       is ``tool_call``, and no [DONE]; the upstream was asked once (nothing re-issued);
       the proxy counts one refusal for ``tool_call``."""
    upstream = start_scripted(janitor, tmp_path)
    proxy = start_proxy(janitor, tmp_path, upstream)
    chunks, last = await stream(f"{proxy.url}/v1/chat/completions",
                                {"model": "sim", "messages": MESSAGES})
    assert last == ""
    assert "tool_calls" in chunks[-2]["choices"][0]["delta"]
    assert chunks[-1]["error"]["code"] == "tool_call"
    asked = await asyncio.to_thread(httpx.get, f"{upstream}/requests", timeout=10)
    assert asked.json()["chat"] == 1
    assert proxy.metrics()['continuation_proxy_refused_total{reason="tool_call"}'] == 1


async def test_a_continuation_the_engine_refuses_is_retried_until_it_serves(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. One engine that holds after 4 tokens, the proxy straight in front of it.
    2. Stream 8 tokens; at the 4th the engine hands the stream back, and from then on
       every request before its first token (it is draining).
    3. Once the proxy has retried a continuation, the engine serves again
       (``/internal/resume``): the client gets exactly the engine's 8 tokens and [DONE].
    4. The proxy counts one continuation, and at least one retry."""
    engine = start_sim(schedulers=1, token_interval_ms=1, hold_after_tokens=HOLD)
    proxy = start_proxy(janitor, tmp_path, engine.url)
    handed = hand_back_at(engine)

    async def on_chunk(n: int) -> None:
        await handed(n)
        if n == HOLD:
            asyncio.get_running_loop().create_task(_resume_after_a_retry(proxy, engine))

    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": 8}, on_chunk)
    assert tokens_of(chunks) == expected_tokens(PROMPT, 8)
    assert last == "[DONE]"
    seen = proxy.metrics()
    assert seen["continuation_proxy_continuations_total"] == 1
    assert seen["continuation_proxy_upstream_retries_total"] >= 1


async def _resume_after_a_retry(proxy: Proxy, engine: EngineHandle) -> None:
    await asyncio.to_thread(
        wait_for, lambda: proxy.metrics()["continuation_proxy_upstream_retries_total"] >= 1,
        what="a retried continuation")
    (await asyncio.to_thread(httpx.post, f"{engine.url}/internal/resume")).raise_for_status()


async def test_a_stream_that_breaks_mid_way_is_continued(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Engine A reached through a TCP relay process, engine B, the router over both,
       the proxy.
    2. Stream a 20-token completion; it goes to A; at its 4th token the relay is killed
       (SIGKILL): the stream breaks, no hand-back, no [DONE].
    3. The client gets exactly the engine's 20 tokens and [DONE]: the proxy continued
       on B from the 4 tokens it had; it counts one broken stream."""
    a, b = two_engines(start_sim)
    relay = janitor.spawn_python([str(RELAY), a.url.rsplit(":", 1)[1]],
                                 stdout=subprocess.PIPE)
    assert relay.stdout is not None
    relayed = f"http://127.0.0.1:{int(relay.stdout.readline())}"
    proxy = proxy_over(janitor, tmp_path, [relayed, b.url])

    async def cut(n: int) -> None:
        if n == HOLD:
            os.kill(relay.pid, signal.SIGKILL)
            await asyncio.to_thread(relay.wait, 30)

    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS}, cut)
    assert tokens_of(chunks) == expected_tokens(PROMPT, TOKENS), proxy.log_text()
    assert last == "[DONE]"
    one_stream(chunks)
    seen = proxy.metrics()
    assert (seen["continuation_proxy_broken_total"],
            seen["continuation_proxy_continuations_total"]) == (1, 1)
    assert health(b)["completed"] == 1


async def test_a_client_that_goes_away_releases_the_upstream_stream(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. One engine that holds its streams after 4 tokens, the proxy straight in front.
    2. Stream a completion; after its 4th token the client closes its connection.
    3. The proxy closes its upstream stream: the engine's own in-flight count falls to 0
       (a held stream would otherwise wait for a hand-back for ever)."""
    engine = start_sim(schedulers=1, token_interval_ms=1, hold_after_tokens=HOLD)
    proxy = start_proxy(janitor, tmp_path, engine.url)
    async with httpx.AsyncClient(timeout=60) as client, client.stream(
            "POST", f"{proxy.url}/v1/completions",
            json={"model": "sim", "prompt": PROMPT, "max_tokens": TOKENS, "stream": True}
    ) as response:
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen == HOLD:
                break
    await asyncio.to_thread(wait_for, lambda: health(engine)["inflight"] == 0,
                            what="the engine's stream released")


async def test_a_completion_is_continued_by_token_ids_when_the_engine_gives_them(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. The proxy in front of an upstream that streams token ids as vLLM does
       (``return_token_ids``: the prompt's ids in the first chunk, each token's id in its
       chunk) and hands a stream back after 3 tokens.
    2. Stream a 6-token completion of a text prompt: the client gets the 6 tokens in order
       and [DONE], and no token ids (it did not ask for them).
    3. The upstream was asked twice, both times for token ids; the continuation's prompt is
       the prompt's ids followed by the 3 ids streamed, for the 3 tokens left: exact, with
       nothing tokenized again."""
    upstream = start_scripted(janitor, tmp_path)
    proxy = start_proxy(janitor, tmp_path, upstream)
    chunks, last = await stream(f"{proxy.url}/v1/completions",
                                {"model": "sim", "prompt": "Once", "max_tokens": 6})
    assert tokens_of(chunks) == [f" t{i}" for i in range(6)]
    assert last == "[DONE]"
    assert not [c for c in chunks if {"token_ids", "prompt_token_ids"} & set(c["choices"][0])]
    asked = (await asyncio.to_thread(httpx.get, f"{upstream}/requests", timeout=10)).json()
    first, again = asked["completions"]
    assert first["return_token_ids"] is True
    assert first["prompt"] == "Once"
    assert again["return_token_ids"] is True
    assert (again["prompt"], again["max_tokens"]) == ([1, 2, 3, 100, 101, 102], 3)


async def test_streams_handed_back_together_each_arrive_whole(
    janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Engines A (holds after 4 tokens) and B, the round-robin router, the proxy.
    2. Six 20-token streams through the proxy at once, each its own prompt (completions
       and chats alternating): the router sends three to A, three to B.
    3. Once B has completed its three (its own count) and A holds its three (in flight,
       4 tokens each reached the proxy), A hands all three back at once.
    4. Every stream is exactly the engine's 20 tokens for its prompt and ends with [DONE];
       A handed back three, B completed six; the proxy counts three continuations."""
    a, b = two_engines(start_sim)
    proxy = proxy_over(janitor, tmp_path, [a.url, b.url])
    requests: list[tuple[str, dict[str, Any], str]] = []
    for i in range(6):
        if i % 2:
            messages = [{"role": "user", "content": f"Question {i}: what drains a pod?"}]
            requests.append(("/v1/chat/completions", {"messages": messages},
                             chat_context(messages)))
        else:
            requests.append(("/v1/completions", {"prompt": f"Prompt {i}"}, f"Prompt {i}"))
    streams = [asyncio.ensure_future(stream(f"{proxy.url}{path}",
                                            {"model": "sim", **body, "max_tokens": TOKENS}))
               for path, body, _ in requests]

    def all_held() -> bool:
        done = [s for s in streams if s.done()]
        if len(done) > 3:
            raise AssertionError(f"{len(done)} streams ended before the hand-back")
        return (health(b)["completed"] == 3 and health(a)["inflight"] == 3
                and proxy.metrics()["continuation_proxy_tokens_total"] == 3 * TOKENS + 3 * HOLD)

    await asyncio.to_thread(wait_for, all_held, what="B done with 3 streams, A holding 3")
    async with httpx.AsyncClient(timeout=30) as client:
        (await client.post(f"{a.url}/internal/handoff")).raise_for_status()
    results = await asyncio.gather(*streams)
    for (_, _, context), (chunks, last) in zip(requests, results, strict=True):
        assert tokens_of(chunks) == expected_tokens(context, TOKENS), context
        assert last == "[DONE]"
        one_stream(chunks)
    assert (health(a)["handed_back"], health(b)["completed"]) == (3, 6)
    assert proxy.metrics()["continuation_proxy_continuations_total"] == 3
