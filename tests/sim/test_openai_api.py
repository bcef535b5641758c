"""The simulated engine's OpenAI surface and router probes over real HTTP: chat on the
deterministic tokens, its continuation, and what routers detect a backend with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from devstack.sim import expected_tokens
from devstack.sim.chat_template import chat_context
from tests.sim.conftest import StartEngine
from tests.sim.openai_events import Last, read_chunks, tokens_of

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer in made-up words."},
    {"role": "user", "content": [{"type": "text", "text": "What drains "},
                                 {"type": "text", "text": "a pod?"}]},
]


async def _chat_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any],
    on_chunk: Callable[[int], Awaitable[None]] | None = None, **kwargs: Any,
) -> tuple[list[dict[str, Any]], Last]:
    """The chunks of a streamed chat completion and its last event."""
    async with client.stream("POST", f"{url}/v1/chat/completions",
                             json={**body, "stream": True}, **kwargs) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return await read_chunks(response, on_chunk)


def test_probes_describe_an_sglang_engine(start_sim: StartEngine) -> None:
    """1. Start an engine with two schedulers. 2. /v1/models lists the one model, owned by
    sglang (what smg detects the backend by). 3. /server_info and /get_server_info give its
    tensor-parallel size (2) and version; /model_info and /get_model_info say it generates.
    4. /version answers, /health_generate is 200 while serving."""
    engine = start_sim(schedulers=2)
    with httpx.Client(base_url=engine.url, timeout=10) as client:
        models = client.get("/v1/models").json()
        assert [(m["id"], m["owned_by"], m["root"]) for m in models["data"]] == [
            ("sim", "sglang", "sim")]
        for path in ("/server_info", "/get_server_info"):
            info = client.get(path).json()
            assert (info["served_model_name"], info["tp_size"], info["dp_size"]) == ("sim", 2, 1)
            assert info["version"] == client.get("/version").json()["version"]
        for path in ("/model_info", "/get_model_info"):
            assert client.get(path).json()["is_generation"] is True
        assert client.get("/health_generate").status_code == 200


def test_dp_engine_reports_its_data_parallel_size(start_sim: StartEngine) -> None:
    """1. Start an engine with a DP controller of two schedulers. 2. /server_info says
    dp_size 2 and tp_size 1."""
    engine = start_sim(dp=2)
    info = httpx.get(f"{engine.url}/server_info", timeout=10).json()
    assert (info["tp_size"], info["dp_size"]) == (1, 2)


async def test_chat_streams_the_chat_contexts_tokens(start_sim: StartEngine) -> None:
    """1. Stream a 10-token chat answer with usage. 2. One chunk a token: the expected tokens
    of the conversation's chat context, the first chunk with the assistant role, the last
    with finish_reason "length". 3. A usage chunk without choices, then [DONE]. 4. The
    same request without streaming: one assistant message with the same text."""
    engine = start_sim(token_interval_ms=1)
    expected = expected_tokens(chat_context(MESSAGES), 10)
    async with httpx.AsyncClient(timeout=30) as client:
        chunks, last = await _chat_stream(client, engine.url, {
            "messages": MESSAGES, "max_tokens": 10, "stream_options": {"include_usage": True}})
        whole = (await client.post(f"{engine.url}/v1/chat/completions",
                                   json={"messages": MESSAGES, "max_tokens": 10})).json()
    assert last == "[DONE]"
    assert tokens_of(chunks) == expected
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "".join(expected)}


async def test_continue_final_message_yields_the_rest_of_the_answer(
    start_sim: StartEngine,
) -> None:
    """1. Ask for a 15-token answer. 2. Ask again with its first 6 tokens as an open
    assistant message (continue_final_message, no generation prompt) for 9 tokens. 3. The
    continuation is exactly tokens 7-15 of the answer."""
    engine = start_sim(token_interval_ms=1)
    async with httpx.AsyncClient(timeout=30) as client:
        chunks, _ = await _chat_stream(client, engine.url,
                                       {"messages": MESSAGES, "max_tokens": 15})
        answer = tokens_of(chunks)
        partial = [*MESSAGES, {"role": "assistant", "content": "".join(answer[:6])}]
        rest, last = await _chat_stream(client, engine.url, {
            "messages": partial, "max_tokens": 9, "continue_final_message": True,
            "add_generation_prompt": False})
    assert tokens_of(rest) == answer[6:]
    assert last == "[DONE]"


async def test_chat_stream_handed_back(start_sim: StartEngine) -> None:
    """1. Start an engine whose streams wait after 3 tokens. 2. Stream a 12-token chat
    answer; once 3 tokens are in, POST /internal/handoff. 3. The stream ends with the
    handed-back event (its request id, 3 tokens) and no [DONE]."""
    engine = start_sim(token_interval_ms=1, hold_after_tokens=3)
    async with httpx.AsyncClient(timeout=30) as client:

        async def hand_back_at_3(n: int) -> None:
            if n == 3:
                await client.post(f"{engine.url}/internal/handoff")

        chunks, last = await _chat_stream(client, engine.url,
                                          {"messages": MESSAGES, "max_tokens": 12},
                                          hand_back_at_3, headers={"X-Request-Id": "chat-1"})
    assert tokens_of(chunks) == expected_tokens(chat_context(MESSAGES), 3)
    assert isinstance(last, dict)
    assert (last["request_id"], last["tokens"]) == ("chat-1", 3)


async def test_chat_requests_refused_with_the_reason(start_sim: StartEngine) -> None:
    """1. Send chat requests that cannot be served: no messages, an unknown role, n=2,
    continue_final_message after a user message, both it and a generation prompt, a
    max_tokens that is not an integer, a body that is not JSON. 2. Each is a 4xx with a
    detail naming what is wrong; none is a 5xx."""
    engine = start_sim()
    url = f"{engine.url}/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any] | None, str]] = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"messages": user, "n": 2}, "'n'"),
        ({"messages": user, "continue_final_message": True,
          "add_generation_prompt": False}, "assistant"),
        ({"messages": [*user, {"role": "assistant", "content": "x"}],
          "continue_final_message": True}, "add_generation_prompt"),
        ({"messages": user, "max_tokens": "many"}, "max_tokens"),
        (None, "JSON"),
    ]
    async with httpx.AsyncClient(timeout=30) as client:
        for body, word in cases:
            response = await (client.post(url, content=b"{not json") if body is None
                              else client.post(url, json=body))
            assert 400 <= response.status_code < 500, (body, response.text)
            assert word in response.json()["detail"], (body, response.text)
