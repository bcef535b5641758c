"""Reading OpenAI-style streams in tests: completions (``choices[0].text``) and chat
(``choices[0].delta.content``) alike, ending with ``[DONE]`` or the handed-back event."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

Last = dict[str, Any] | str
"""A stream's last event: ``"[DONE]"``, the handed-back object, or ``""`` (it just ended)."""


def token_text(chunk: dict[str, Any]) -> str | None:
    """The token a completion or chat chunk carries; None for one without (usage only)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if "delta" in choice:
        content: str | None = choice["delta"].get("content")
        return content
    text: str = choice["text"]
    return text


def tokens_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [text for chunk in chunks if (text := token_text(chunk)) is not None]


async def read_chunks(
    response: httpx.Response, on_chunk: Callable[[int], Awaitable[None]] | None = None
) -> tuple[list[dict[str, Any]], Last]:
    """The parsed chunks of a server-sent event stream and its last event; ``on_chunk(n)``
    runs after the n-th chunk."""
    chunks: list[dict[str, Any]] = []
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            return chunks, payload
        event = json.loads(payload)
        if event.get("handed_back"):
            return chunks, event
        chunks.append(event)
        if on_chunk is not None:
            await on_chunk(len(chunks))
    return chunks, ""
