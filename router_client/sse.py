"""Server-sent events of OpenAI-style streaming completions: read and write."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

DONE = "[DONE]"
_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every event (``json.dumps`` with arguments builds one per call)."""


def encode(data: dict[str, Any] | str) -> bytes:
    """One ``data:`` event."""
    body = data if isinstance(data, str) else _ENCODER.encode(data)
    return f"data: {body}\n\n".encode()


async def events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any] | str]:
    """The ``data`` of each event: ``DONE`` as a string, everything else parsed as JSON."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line.strip() and data:
            yield _parse("\n".join(data))
            data = []
    if data:
        yield _parse("\n".join(data))


MAX_EVENT_BYTES = 8 << 20
"""Longest event taken from raw bytes (``events_of_bytes``): an upstream that streams more
without ending an event is not sending server-sent events."""


async def events_of_bytes(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any] | str]:
    """The same events as ``events``, read from a body's raw bytes as they arrive (lines end
    in LF or CRLF): no text decoding or line splitting layer between the socket and the
    parse, which is most of a relay's work per token. Raises ValueError on an event longer
    than ``MAX_EVENT_BYTES`` or data that is not UTF-8 JSON."""
    partial: list[bytes] = []  # a line not ended yet, in the pieces it came in
    held = 0  # bytes of ``partial`` and ``data``
    data: list[bytes] = []
    async for chunk in chunks:
        if b"\n" in chunk:
            lines = (b"".join(partial) + chunk if partial else chunk).split(b"\n")
            partial = []
            last = lines.pop()
            for line in lines:
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip(b" ").rstrip(b"\r"))
                elif data and not line.strip():
                    yield _parse_bytes(data)
                    data = []
            chunk = last
            held = sum(map(len, data))
        if chunk:
            # Joined only once its line ends: a long line costs one copy, not one per piece.
            partial.append(chunk)
            held += len(chunk)
        if held > MAX_EVENT_BYTES:
            raise ValueError(f"an event of more than {MAX_EVENT_BYTES} bytes")
    rest = b"".join(partial)
    if rest.startswith(b"data:"):
        data.append(rest[5:].lstrip(b" ").rstrip(b"\r"))
    if data:
        yield _parse_bytes(data)


def _parse_bytes(data: list[bytes]) -> dict[str, Any] | str:
    return _parse((data[0] if len(data) == 1 else b"\n".join(data)).decode())


def _parse(data: str) -> dict[str, Any] | str:
    if data.strip() == DONE:
        return DONE
    value = json.loads(data)
    return value if isinstance(value, dict) else {"value": value}


def chunk_text(event: dict[str, Any]) -> str:
    """The text of one completion chunk ("" when it carries none)."""
    choices = event.get("choices") or [{}]
    text = choices[0].get("text")
    return text if isinstance(text, str) else ""
