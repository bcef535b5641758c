"""Request bodies at the proxy's door: bounded, and JSON the upstream can take, or a clear 4xx.

    raw = await read_body(request, limits)      # BadBody(413) past the size limit
    body = parse_json(raw, limits)              # BadBody(400): not JSON, NaN, too deep

Nothing a client sends makes the proxy answer 5xx: a body too large is 413 (checked on the
declared length before a byte is read, then on what arrives), one that is not UTF-8 JSON,
holds ``NaN``/``Infinity`` (JSON has neither, and engines' parsers refuse them or worse) or
nests deeper than ``max_depth`` is 400, and a field of the wrong type is 422
(``router_client.openai_requests.check_request``, in the app).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body (bytes): a long conversation is a few hundred KB; the coordinator's
own limit is the same."""
MAX_DEPTH = 64
"""Deepest nesting of objects and lists: an OpenAI request nests about 6 deep (tool
schemas more); far deeper is an attack on the parsers behind the proxy."""


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = MAX_BODY_BYTES
    max_depth: int = MAX_DEPTH


class BadBody(Exception):
    """A body the proxy refuses: ``status`` (4xx) and ``detail`` for the answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def read_body(request: Request, limits: Limits) -> bytes:
    """The whole body, or ``BadBody`` (413) as soon as it is known to be too large."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadBody(400, "Content-Length must be a number")
        if int(declared) > limits.max_body_bytes:
            raise BadBody(413, f"the body is larger than {limits.max_body_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise BadBody(413, f"the body is larger than {limits.max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes, limits: Limits) -> Any:
    """The body as JSON, or ``BadBody`` (400) saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadBody(400, "the body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadBody(400, f"the body nests deeper than {limits.max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer too long
        raise BadBody(400, f"the body is not valid JSON: {exc}") from None
    problem = _shape_problem(value, limits.max_depth)
    if problem:
        raise BadBody(400, problem)
    return value


def _shape_problem(value: Any, max_depth: int) -> str | None:
    """Nesting past ``max_depth``, or a number JSON cannot hold (``1e999`` parses as
    infinity); walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                return f"the body nests deeper than {max_depth} levels"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, float) and not math.isfinite(item):
            return "the body holds a number out of range (NaN or Infinity)"
    return None
