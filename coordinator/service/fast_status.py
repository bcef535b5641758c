"""``GET /status`` without the framework: the hot path many routers poll.

A pure ASGI middleware (behind the request guard, which has checked the token) answers
well-formed ``GET /status`` requests itself — ``?wait=S&since=G`` long-poll, ``view=router``,
ETag/304, the per-generation cached body — and hands everything else (including any
malformed query, so the framework's validation answers it with a 422) to the FastAPI app,
whose ``/status`` route documents and backs the same behaviour.
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.errors import LimitReached
from coordinator.service.runtime import Coordinator
from coordinator.service.status_view import FULL_VIEW, VIEWS

MAX_WAIT_S = 86_400.0
MAX_SINCE = 2**53


def parse_poll(query: bytes) -> tuple[float, int | None, str] | None:
    """(wait, since, view) from a query string, or None when the framework should judge it."""
    if not query:
        return 0.0, None, FULL_VIEW
    wait = 0.0
    since: int | None = None
    view = FULL_VIEW
    try:
        for key, value in parse_qsl(query.decode("ascii"), strict_parsing=True):
            if key == "wait":
                wait = float(value)
                if not 0 <= wait <= MAX_WAIT_S:
                    return None
            elif key == "since":
                since = int(value)
                if not 0 <= since <= MAX_SINCE:
                    return None
            elif key == "view" and value in VIEWS:
                view = value
            else:
                return None
    except (ValueError, UnicodeDecodeError):
        return None
    return wait, since, view


async def long_poll(coordinator: Coordinator, wait: float, since: int | None,
                    cap_s: float) -> None:
    """Return once ``generation`` > ``since`` or after ``min(wait, cap_s)`` seconds;
    ``LimitReached`` when ``max_long_polls`` callers wait already (and it would wait)."""
    if since is None or wait <= 0 or coordinator.machine.generation > since:
        return
    limit = coordinator.settings.max_long_polls
    if coordinator.long_polls >= limit:
        raise LimitReached("max_long_polls", f"{coordinator.long_polls} callers wait on "
                           f"/status already, the limit (--max-long-polls)")
    coordinator.long_polls += 1
    try:
        deadline = time.monotonic() + min(wait, cap_s)
        while coordinator.machine.generation <= since:
            left = deadline - time.monotonic()
            if left <= 0 or not await coordinator.changes.wait(left):
                return
    finally:
        coordinator.long_polls -= 1


RETRY_AFTER_S = 1
"""What a 429 asks the caller to wait before it tries again."""


def limit_headers(exc: LimitReached) -> list[tuple[bytes, bytes]]:
    """Headers of a 429: when to retry, and which limit was hit."""
    return [(b"retry-after", str(RETRY_AFTER_S).encode()),
            (b"x-limit", exc.limit.encode())]


def limit_body(exc: LimitReached) -> bytes:
    return json.dumps({"detail": str(exc), "limit": exc.limit}).encode()


class StatusFastPath:
    """Serves ``GET /status`` directly; passes every other request to ``app``."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator, cap_s: float) -> None:
        self.app = app
        self.coordinator = coordinator
        self.cap_s = cap_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/status" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        if_none_match: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"if-none-match":
                if_none_match = value
        poll = parse_poll(scope["query_string"])
        if poll is None:
            await self.app(scope, receive, send)
            return
        try:
            await long_poll(self.coordinator, poll[0], poll[1], self.cap_s)
        except LimitReached as exc:
            self.coordinator.metrics.limit_refusals.labels(exc.limit).inc()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    *limit_headers(exc)]})
            await send({"type": "http.response.body", "body": limit_body(exc)})
            return
        _, etag, body = self.coordinator.view.status_bytes(poll[2])
        tag = etag.encode()
        if if_none_match == tag:
            await send({"type": "http.response.start", "status": 304,
                        "headers": [(b"etag", tag)]})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"etag", tag), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": body})
