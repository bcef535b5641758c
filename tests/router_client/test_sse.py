"""Server-sent events read from raw bytes (``sse.events_of_bytes``, the continuation
layer's upstream read) give what the line reader gives, however the bytes are cut."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from router_client import sse

STREAM = (
    b'data: {"id":"a","choices":[{"text":"Hel"}]}\n\n'
    b': a comment line\n'
    b'event: ignored\n'
    b'data: {"id":"a",\n'
    b'data: "choices":[{"text":"lo\xc3\xa9"}]}\n\n'
    b'data:{"handed_back":true,"request_id":"r","tokens":2}\r\n\r\n'
    b'data: [DONE]\n\n'
)


async def _chunks(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _read(parts: Iterable[bytes]) -> list[dict[str, Any] | str]:
    async def run() -> list[dict[str, Any] | str]:
        return [e async for e in sse.events_of_bytes(_chunks(parts))]
    return asyncio.run(run())


def _by_lines(data: bytes) -> list[object]:
    async def run() -> list[object]:
        lines = _chunks_of_text(data.decode().splitlines())
        return [e async for e in sse.events(lines)]
    return asyncio.run(run())


async def _chunks_of_text(lines: list[str]) -> AsyncIterator[str]:
    for line in lines:
        yield line


def test_the_events_are_the_line_readers_whole() -> None:
    """1. Read the stream in one chunk, and with the line reader (httpx's lines).
    2. Both give the same four events: two chunks (one of two data lines), the hand-back
       (CRLF line ends) and ``[DONE]``."""
    events = _read([STREAM])
    assert events == _by_lines(STREAM)
    assert [e if isinstance(e, str) else sorted(e) for e in events] == [
        ["choices", "id"], ["choices", "id"], ["handed_back", "request_id", "tokens"],
        sse.DONE]
    assert events[1] == {"id": "a", "choices": [{"text": "loé"}]}


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_any_cut_of_the_bytes_gives_the_same_events(size: int) -> None:
    """Cut into pieces of ``size`` bytes (a cut inside a UTF-8 character, inside ``\\r\\n``,
    between the two newlines of an event's end): the same events."""
    parts = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert _read(parts) == _read([STREAM])


def test_a_last_event_without_its_blank_line_is_still_read() -> None:
    assert _read([b'data: {"a":1}\n\ndata: [DONE]']) == [{"a": 1}, sse.DONE]


def test_data_that_is_not_json_or_not_utf8_raises_value_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        _read([b"data: {not json\n\n"])
    with pytest.raises(UnicodeDecodeError):
        _read([b'data: {"text":"\xff"}\n\n'])


def test_an_event_that_never_ends_is_refused_at_its_limit(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """An upstream that streams without ending an event: a ValueError once the event is
    past ``MAX_EVENT_BYTES``, not a buffer that grows for ever."""
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 1000)
    endless = [b"data: " + b"x" * 300] + [b"x" * 300] * 10
    with pytest.raises(ValueError, match="more than 1000 bytes"):
        _read(endless)
    lines = [b'data: {"a":"' + b"y" * 200 + b'"}\n'] * 10  # data lines, no blank line
    with pytest.raises(ValueError, match="more than 1000 bytes"):
        _read(lines)
