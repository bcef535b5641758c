"""start_engine's failure path, and hand-back driven by an asyncio.Event (in process)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from devstack.sim import expected_tokens, start_engine
from devstack.sim.errors import SimStartupError
from devstack.sim.streams import CompletionStreams, HandedBack, Token
from tests.support.processes import ProcessJanitor


def test_an_engine_that_cannot_start_is_reported(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Hold a listening port. 2. Start the engine on it. 3. start_engine raises
    SimStartupError with the exit code; the main record says why."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SimStartupError, match="exited with 2"):
            start_engine(janitor.spawn, tmp_path, port=port)
    (record,) = tmp_path.glob("main-*.json")
    assert "cannot listen" in record.read_text()


async def test_a_shutdown_event_hands_every_stream_back() -> None:
    """1. Two streams of 1000 tokens; follow an asyncio.Event. 2. Once both have produced a
    token, set the event. 3. Both end with HandedBack carrying their token counts, and what
    they produced is a correct prefix."""
    streams = CompletionStreams(token_interval_s=0.001)
    event = asyncio.Event()
    follower = asyncio.create_task(streams.follow_shutdown_event(event))
    produced: dict[str, list[str]] = {"a": [], "b": []}
    first_tokens = {rid: asyncio.Event() for rid in produced}
    handed: dict[str, HandedBack] = {}

    async def consume(rid: str) -> None:
        async for item in streams.generate(rid, rid, 1000):
            if isinstance(item, Token):
                produced[rid].append(item.text)
                first_tokens[rid].set()
            else:
                handed[rid] = item

    consumers = [asyncio.create_task(consume(rid)) for rid in produced]
    await asyncio.gather(*(e.wait() for e in first_tokens.values()))
    event.set()
    await asyncio.gather(*consumers, follower)
    for rid, tokens in produced.items():
        assert handed[rid] == HandedBack(rid, len(tokens))
        assert tokens == expected_tokens(rid, len(tokens))
        assert len(tokens) < 1000
    assert streams.inflight == {}
