"""Server-sent events of OpenAI-style streaming completions: read and write."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

DONE = "[DONE]"


def encode(data: dict[str, Any] | str) -> bytes:
    """One ``data:`` event."""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
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
