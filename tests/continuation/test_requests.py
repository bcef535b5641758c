"""The continuation's pure parts, without a process: what is checked and refused, the bodies
that continue a request, how chunks of several attempts become one stream, and how a
collected answer is put together."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from router_client import ContinuingClient
from router_client.collect import Collector
from router_client.errors import UpstreamRejected
from router_client.openai_requests import (
    CHAT,
    COMPLETIONS,
    Refusal,
    Streamed,
    check_request,
    continuation_body,
    first_body,
    request_refusal,
    stream_refusal,
)
from router_client.stitching import Stitcher
from router_client.upstream import (
    MAX_ANSWER_BYTES,
    Refused,
    RetryPolicy,
    _opening,
    upstream_headers,
)

USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(("path", "body", "names"), [
    (COMPLETIONS, [], "JSON object"),
    (COMPLETIONS, {"prompt": "p", "max_tokens": "8"}, "'max_tokens'"),
    (COMPLETIONS, {"prompt": "p", "max_tokens": True}, "'max_tokens'"),
    (COMPLETIONS, {"prompt": "p", "n": -1}, "'n'"),
    (COMPLETIONS, {"prompt": "p", "stream": "yes"}, "'stream'"),
    (COMPLETIONS, {"prompt": {"text": "p"}}, "'prompt'"),
    (COMPLETIONS, {"prompt": [1, -2]}, "'prompt'"),
    (COMPLETIONS, {"prompt": "p", "stop": [1]}, "'stop'"),
    (CHAT, {"messages": []}, "'messages'"),
    (CHAT, {"messages": [{"content": "x"}]}, "messages[0]"),
    (CHAT, {"messages": USER, "logprobs": 2}, "'logprobs'"),
    (CHAT, {"messages": USER, "stream_options": []}, "'stream_options'"),
])
def test_wrong_types_are_named(path: str, body: Any, names: str) -> None:
    """1. Check each malformed body: the problem names the field (a proxy answers 422)."""
    problem = check_request(path, body) or ""
    assert names in problem, problem


def test_well_formed_bodies_pass() -> None:
    """1. A plain completion, one with token ids, a batch, a chat with every switch: no
    problem (the upstream judges what the continuation does not compute with)."""
    for path, body in [(COMPLETIONS, {"prompt": "p", "max_tokens": 4, "stream": True}),
                       (COMPLETIONS, {"prompt": [1, 2, 3], "logprobs": 2}),
                       (COMPLETIONS, {"prompt": ["a", "b"], "unknown": {"x": 1}}),
                       (CHAT, {"messages": USER, "max_completion_tokens": 3, "n": 1,
                               "logprobs": True, "stop": ["x"], "continue_final_message":
                               False, "stream_options": {"include_usage": True}})]:
        assert check_request(path, body) is None


@pytest.mark.parametrize(("path", "body", "reason"), [
    (COMPLETIONS, {"prompt": "p", "n": 2}, Refusal.N),
    (COMPLETIONS, {"prompt": "p", "best_of": 3}, Refusal.BEST_OF),
    (COMPLETIONS, {"prompt": "p", "echo": True}, Refusal.ECHO),
    (COMPLETIONS, {"prompt": ["a", "b"]}, Refusal.BATCH_PROMPT),
    (COMPLETIONS, {}, Refusal.NO_PROMPT),
    (CHAT, {"messages": [*USER, {"role": "assistant", "content": [{"type": "image_url"}]}],
            "continue_final_message": True}, Refusal.ASSISTANT_PREFILL),
    (CHAT, {"messages": USER}, None),
    (COMPLETIONS, {"prompt": "p", "n": 1, "best_of": 1, "echo": False}, None),
])
def test_what_a_request_is_refused_for(path: str, body: dict[str, Any],
                                       reason: Refusal | None) -> None:
    """1. Each request that cannot be continued exactly names its reason; the others none."""
    assert request_refusal(path, body) == reason


def test_what_a_stream_is_refused_for() -> None:
    """1. A tool call or reasoning streamed refuses the stream.
    2. A token-id prompt with no token ids streamed cannot be continued; with them, or with
       nothing streamed yet, it can."""
    text = Streamed("x", 1)
    assert stream_refusal(CHAT, {}, text, tool_call=True, reasoning=False) == Refusal.TOOL_CALL
    assert stream_refusal(CHAT, {}, text, tool_call=False, reasoning=True) == Refusal.REASONING
    ids = {"prompt": [5, 6]}
    assert stream_refusal(COMPLETIONS, ids, text, tool_call=False, reasoning=False) == \
        Refusal.TOKEN_PROMPT
    assert stream_refusal(COMPLETIONS, ids, Streamed("x", 1, (9,)), tool_call=False,
                          reasoning=False) is None
    assert stream_refusal(COMPLETIONS, ids, Streamed("", 0), tool_call=False,
                          reasoning=False) is None


def test_a_completion_continues_by_token_ids_when_it_has_them_else_by_text() -> None:
    """1. The first body streams, asks for token ids (not with a stop string), and for
       usage when the client did not stream.
    2. With prompt and output ids, the continuation's prompt is both, max_tokens and
       min_tokens shrink by the tokens streamed.
    3. Without ids, the prompt text and the text streamed; a completion's default
       max_tokens (16) is made explicit."""
    first = first_body(COMPLETIONS, {"prompt": "Once", "max_tokens": 10, "min_tokens": 4},
                       ask_token_ids=True)
    assert first["stream"] is True
    assert first["return_token_ids"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert "return_token_ids" not in first_body(COMPLETIONS, {"prompt": "p", "stop": "."},
                                                ask_token_ids=True)
    again = continuation_body(COMPLETIONS, first, Streamed(" upon a", 3, (7, 8, 9), (1, 2)))
    assert again["prompt"] == [1, 2, 7, 8, 9]
    assert (again["max_tokens"], again["min_tokens"]) == (7, 1)
    text = continuation_body(COMPLETIONS, {"prompt": "Once", "stream": True},
                             Streamed(" upon a", 3))
    assert (text["prompt"], text["max_tokens"]) == ("Once upon a", 13)


def test_a_chat_continues_with_an_open_assistant_message() -> None:
    """1. The streamed text becomes an open assistant message, continued, with no
       generation prompt; both limits shrink.
    2. A client that continued its own assistant message gets the text appended to it."""
    first = {"messages": USER, "max_tokens": 9, "max_completion_tokens": 8, "stream": True}
    again = continuation_body(CHAT, first, Streamed(" Hello there", 2))
    assert again["messages"] == [*USER, {"role": "assistant", "content": " Hello there"}]
    assert (again["continue_final_message"], again["add_generation_prompt"]) == (True, False)
    assert (again["max_tokens"], again["max_completion_tokens"]) == (7, 6)
    own = {"messages": [*USER, {"role": "assistant", "content": [
        {"type": "text", "text": "Sure:"}]}], "continue_final_message": True}
    assert continuation_body(CHAT, own, Streamed(" yes", 1))["messages"][-1] == {
        "role": "assistant", "content": "Sure: yes"}


def _chat_chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": extra.pop("id", "a"), "created": extra.pop("created", 1),
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}


def test_chunks_of_two_attempts_make_one_stream() -> None:
    """1. The first attempt's chunks pass; its id and created are the stream's.
    2. After a hand-back at 2 tokens, the continuation's role-only chunk is dropped, its
       chunks get the first id and created, and its usage counts from the first prompt.
    3. What was streamed is the text of both; a tool call is noted."""
    stitcher = Stitcher(CHAT, keep_token_ids=False)
    assert stitcher.take(_chat_chunk({"role": "assistant", "content": ""})) is not None
    stitcher.take(_chat_chunk({"content": " a"}))
    stitcher.take(_chat_chunk({"content": " b"}))
    stitcher.end_attempt(2)
    assert stitcher.take(_chat_chunk({"role": "assistant", "content": ""}, id="b")) is None
    out = stitcher.take(_chat_chunk({"content": " c"}, id="b", created=2))
    assert out is not None
    assert (out["id"], out["created"]) == ("a", 1)
    usage = stitcher.take({"id": "b", "created": 2, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}})
    assert usage is not None
    assert usage["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    assert stitcher.streamed().text == " a b c"
    assert not stitcher.tool_call
    stitcher.take(_chat_chunk({"tool_calls": [{"index": 0}]}))
    assert stitcher.tool_call


def test_completion_token_ids_and_offsets_are_stitched() -> None:
    """1. A client that did not ask for token ids gets none; the stream keeps them (and the
       prompt's) to continue by them.
    2. A continuation's logprobs offsets go on from the text already streamed."""
    stitcher = Stitcher(COMPLETIONS, keep_token_ids=False)
    out = stitcher.take({"id": "a", "created": 1, "choices": [
        {"index": 0, "text": " ab", "token_ids": [4], "prompt_token_ids": [1, 2]}]})
    assert out is not None
    assert "token_ids" not in out["choices"][0]
    assert "prompt_token_ids" not in out["choices"][0]
    stitcher.end_attempt(1)
    out = stitcher.take({"id": "b", "created": 2, "choices": [
        {"index": 0, "text": " c", "token_ids": [5],
         "logprobs": {"text_offset": [0], "tokens": [" c"]}}]})
    assert out is not None
    assert out["choices"][0]["logprobs"]["text_offset"] == [3]
    stitcher.end_attempt(None)
    assert stitcher.streamed() == Streamed(" ab c", 2, (4, 5), (1, 2))


def test_a_collected_chat_answer_puts_tool_calls_together() -> None:
    """1. Collect a chat stream: content joined, a tool call put together from its deltas,
    the finish reason and usage of the stream."""
    collector = Collector(CHAT)
    for delta in ({"role": "assistant", "content": ""}, {"content": "Let me"},
                  {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": '{"a"'}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}):
        collector.add(_chat_chunk(delta, model="m"))
    collector.add({"id": "a", "choices": [{"index": 0, "delta": {},
                                           "finish_reason": "tool_calls"}]})
    collector.add({"id": "a", "choices": [], "usage": {"completion_tokens": 4}})
    answer = collector.answer()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "m"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me"
    assert choice["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    assert answer["usage"] == {"completion_tokens": 4}


def test_token_ids_are_not_used_with_stop_strings() -> None:
    """1. A completion with a stop string: even with token ids in its chunks (the client
       asked for them), what was streamed has none, so it is continued by text (vLLM holds
       back text near a stop string: its ids would run ahead of the text)."""
    stitcher = Stitcher(COMPLETIONS, keep_token_ids=True, use_token_ids=False)
    stitcher.take({"id": "a", "created": 1, "choices": [
        {"index": 0, "text": " ab", "token_ids": [4], "prompt_token_ids": [1, 2]}]})
    stitcher.end_attempt(1)
    streamed = stitcher.streamed()
    assert streamed.token_ids is None
    first = {"prompt": "x", "stop": ["."], "max_tokens": 5}
    assert continuation_body(COMPLETIONS, first, streamed)["prompt"] == "x ab"


async def test_a_refused_attempt_is_retried_within_the_policy_and_a_rejection_is_not() -> None:
    """1. Run a try that is always refused under a 4-try policy, with tenacity's sleep
       replaced (nothing sleeps): 4 tries, 3 waits, doubling from the first wait up to the
       cap, each plus at most one first wait of jitter; then the refusal is raised.
    2. A rejection (any other status) is raised at the first try."""
    policy = RetryPolicy(attempts=4, within_s=60, first_wait_s=0.05, max_wait_s=0.15)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def run(error: Exception) -> int:
        tries = 0

        async def always(failing: Exception) -> None:
            nonlocal tries
            async for attempt in policy.retrying().copy(sleep=sleep):
                with attempt:
                    tries += 1
                    raise failing

        with pytest.raises(type(error)):
            await always(error)
        return tries

    assert await run(Refused(503, b"")) == 4
    assert len(slept) == 3
    assert 0.05 <= slept[0] <= 0.1
    assert 0.1 <= slept[1] <= 0.15
    assert 0.15 <= slept[2] <= 0.2
    slept.clear()
    assert await run(UpstreamRejected(400, b"")) == 1
    assert slept == []


async def test_an_attempt_is_taken_at_its_first_token_not_its_role_chunk() -> None:
    """1. A chat stream that opens with a role-only chunk and is then handed back: the
       opening read runs past the role chunk to the hand-back (so the attempt counts as
       refused, and is retried, not continued).
    2. One whose second chunk has a token stops there; an empty stream gives nothing."""

    async def events(*items: dict[str, Any] | str) -> AsyncIterator[dict[str, Any] | str]:
        for item in items:
            yield item

    role = _chat_chunk({"role": "assistant", "content": ""})
    handed = {"handed_back": True, "request_id": "r.0", "tokens": 0}
    assert await _opening(events(role, handed, "[DONE]")) == [role, handed]
    token = _chat_chunk({"content": " a"})
    assert await _opening(events(role, token, handed)) == [role, token]
    assert await _opening(events()) == []


def test_the_callers_own_connection_headers_and_content_type_are_not_sent_upstream() -> None:
    """The body every attempt sends is the continuation layer's own JSON: the caller's
    ``Content-Type`` (any case) is not sent beside it, nor its connection's headers; its
    ``X-Request-Id`` names the request."""
    request_id, sent = upstream_headers({"content-TYPE": "text/plain", "X-Request-Id": "r1",
                                         "Authorization": "Bearer t", "Content-Length": "9",
                                         "Connection": "keep-alive"})
    assert (request_id, sent) == ("r1", {"Authorization": "Bearer t"})


async def test_a_rejection_is_kept_to_its_first_megabyte() -> None:
    """1. An upstream on loopback answers every request 400 with a 3 MiB body.
    2. The first attempt's rejection reaches the caller (``UpstreamRejected``) with the
       body's first ``MAX_ANSWER_BYTES`` only, as the upstream sent them: an error page is
       relayed, a flood is not held in memory."""
    size = 3 << 20

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n"
                     b"content-length: %d\r\n\r\n" % size)
        with contextlib.suppress(ConnectionError):
            for _ in range(size // 65536):
                writer.write(b"x" * 65536)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with ContinuingClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(UpstreamRejected) as rejected:
                await client.complete("/v1/completions", {"prompt": "p", "max_tokens": 2})
    finally:
        server.close()
    assert rejected.value.status == 400
    assert rejected.value.body == b"x" * MAX_ANSWER_BYTES
