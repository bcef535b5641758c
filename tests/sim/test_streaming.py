"""Streaming completions over real HTTP: tokens, request ids, hand-back and continuation."""

from __future__ import annotations

import httpx

from devstack.sim import EngineHandle, expected_tokens
from tests.sim.conftest import StartEngine
from tests.sim.support import read_events

PROMPT = "Explain process trees in one paragraph:"


async def _stream(
    client: httpx.AsyncClient, engine: EngineHandle, prompt: str, max_tokens: int, rid: str
) -> tuple[list[str], dict[str, object] | str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    headers = {"X-Request-Id": rid}
    async with client.stream(
        "POST", f"{engine.url}/v1/completions", json=body, headers=headers
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-request-id"] == rid
        return await read_events(response)


async def test_stream_yields_the_expected_tokens_then_done(start_sim: StartEngine) -> None:
    """1. Start the engine. 2. Stream 12 tokens. 3. They are expected_tokens(prompt, 12),
    the stream ends with [DONE], and /health counts one completed request."""
    engine = start_sim(token_interval_ms=1)
    async with httpx.AsyncClient(timeout=30) as client:
        tokens, last = await _stream(client, engine, PROMPT, 12, "req-1")
        assert tokens == expected_tokens(PROMPT, 12)
        assert last == "[DONE]"
        health = (await client.get(f"{engine.url}/health")).json()
    assert health["completed"] == 1
    assert health["inflight"] == 0
    assert health["watchdog"] == "armed"


async def test_non_streaming_completion_and_request_id(start_sim: StartEngine) -> None:
    """1. Ask for 5 tokens without streaming. 2. One JSON body with the whole text,
    the X-Request-Id as its id."""
    engine = start_sim(token_interval_ms=1)
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{engine.url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 5},
            headers={"X-Request-Id": "abc"},
        )
    body = response.json()
    assert body["id"] == "abc"
    assert body["choices"][0]["text"] == "".join(expected_tokens(PROMPT, 5))


async def test_handed_back_stream_continues_elsewhere_exactly(start_sim: StartEngine) -> None:
    """1. Start an engine whose streams wait after 3 tokens for a hand-back (not the token
    clock), and a second one that does not. 2. Start a 40-token stream on the first; once
    it has 3 tokens, ask for a hand-back. 3. The stream ends with {"handed_back",
    "request_id", "tokens": 3} and no [DONE]. 4. Continue on the second engine with prompt +
    text so far and the remaining max_tokens. 5. Both parts together are exactly the
    uninterrupted stream; the first engine counts one hand-back, the second one completion.
    6. After /internal/resume the first engine serves again (a stream short of the hold
    runs to [DONE])."""
    engine = start_sim(token_interval_ms=5, hold_after_tokens=3)
    elsewhere = start_sim(token_interval_ms=1)
    async with httpx.AsyncClient(timeout=30) as client:

        async def hand_back_after_three(n: int) -> None:
            if n == 3:
                answer = await client.post(f"{engine.url}/internal/handoff")
                assert answer.json()["handing_back"] == 1

        body = {"prompt": PROMPT, "max_tokens": 40, "stream": True}
        async with client.stream(
            "POST", f"{engine.url}/v1/completions", json=body, headers={"X-Request-Id": "m1"}
        ) as response:
            first, last = await read_events(response, hand_back_after_three)
        assert last == {"handed_back": True, "request_id": "m1", "tokens": 3}
        assert len(first) == 3

        rest, done = await _stream(client, elsewhere, PROMPT + "".join(first), 37, "m1")
        assert done == "[DONE]"
        health = (await client.get(f"{engine.url}/health")).json()
        other = (await client.get(f"{elsewhere.url}/health")).json()

        await client.post(f"{engine.url}/internal/resume")
        short, short_done = await _stream(client, engine, PROMPT, 3, "after-resume")
    assert first + rest == expected_tokens(PROMPT, 40)
    assert (health["handed_back"], health["completed"]) == (1, 0)
    assert (other["handed_back"], other["completed"]) == (0, 1)
    assert (short, short_done) == (expected_tokens(PROMPT, 3), "[DONE]")


async def test_requests_while_handing_back_are_handed_back_at_once(
    start_sim: StartEngine,
) -> None:
    """1. Ask for a hand-back with nothing in flight. 2. A new stream ends at once,
    handed back after 0 tokens."""
    engine = start_sim(token_interval_ms=1)
    async with httpx.AsyncClient(timeout=30) as client:
        assert (await client.post(f"{engine.url}/internal/handoff")).json()["handing_back"] == 0
        tokens, last = await _stream(client, engine, PROMPT, 10, "late")
    assert tokens == []
    assert last == {"handed_back": True, "request_id": "late", "tokens": 0}


async def test_bad_requests_get_json_errors(start_sim: StartEngine) -> None:
    """1. Send a body that is not JSON, then wrong types. 2. Each gets a 4xx JSON detail."""
    engine = start_sim()
    url = f"{engine.url}/v1/completions"
    async with httpx.AsyncClient(timeout=30) as client:
        not_json = await client.post(url, content=b"{nope")
        wrong = [
            await client.post(url, json=body)
            for body in ([1], {"prompt": 3}, {"max_tokens": "5"}, {"max_tokens": -1},
                         {"stream": "yes"})
        ]  # fmt: skip
        missing = await client.get(f"{engine.url}/nowhere")
    assert not_json.status_code == 400
    assert all(r.status_code == 422 and r.json()["detail"] for r in wrong)
    assert missing.status_code == 404
    assert missing.json()["detail"]
