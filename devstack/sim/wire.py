"""What the simulated engine's HTTP answers share: server-sent events, errors, hand-backs."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from devstack.sim.streams import HandedBack
from worker_client import handed_back_event

Parsed = TypeVar("Parsed")

MODEL_NAME = "sim"
"""The one model the simulated engine serves (``/v1/models``, every answer's ``model``)."""
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 100_000


def error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <compact JSON or text>`` and a blank line."""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


def handed_back(event: HandedBack) -> dict[str, Any]:
    """The last event of a handed-back stream (the streaming convention's)."""
    return handed_back_event(event.request_id, event.tokens)


def parse_max_tokens(body: dict[str, Any], *names: str) -> int | str:
    """The first of ``names`` present and not null (default ``DEFAULT_MAX_TOKENS``), or
    what is wrong with it."""
    name = next((n for n in names if body.get(n) is not None), None)
    if name is None:
        return DEFAULT_MAX_TOKENS
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        return f"'{name}' must be an integer"
    if not 0 <= value <= MAX_TOKENS_LIMIT:
        return f"'{name}' must be between 0 and {MAX_TOKENS_LIMIT}"
    return value


async def parse_body(
    request: Request, parse: Callable[[Any], Parsed | str]
) -> Parsed | JSONResponse:
    """The request's JSON body through ``parse``, or the 400 or 422 answer saying why not."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "the body is not valid JSON")
    parsed = parse(body)
    if isinstance(parsed, str):
        return error(422, parsed)
    return parsed


def request_id(request: Request, prefix: str) -> str:
    """The ``X-Request-Id`` the caller named the request with, or a fresh id."""
    return request.headers.get("x-request-id") or f"{prefix}-{uuid.uuid4().hex}"


def sse_response(events: AsyncIterator[bytes], request_id: str) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
    )
