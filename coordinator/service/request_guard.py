"""The first thing every request meets: what a browser may not do, the token, then the body's
size and pace, before any byte of the body is read or any handler runs.

Steps, for each HTTP request:

    0. a ``Host`` the coordinator does not answer to (421), a request a browser made for
       another site (``Sec-Fetch-Site``, ``Origin``: 403) or a web form's body (415), on
       every path, probes included (``coordinator.service.browsers``);
    1. a path that is not a probe (``/healthz``, ``/readyz``, ``/metrics``) without the token
       is answered 401 at once: an unauthenticated caller cannot make the coordinator read,
       parse or hold anything it sent;
    2. a ``Content-Length`` above ``max_body_bytes`` is answered 413 at once;
    3. a request that carries a body has it read here, in full, within ``read_timeout_s``
       (408 when it dribbles) and never beyond ``max_body_bytes`` (413 for a chunked body
       that grows past it), then handed to the app from memory;
    4. everything else (the app's own receive, the response) passes through untouched.

Every refusal is JSON ``{"detail": ...}`` naming the limit, and closes the connection
(the rest of a refused body is not read).
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.service.auth import TokenCheck
from coordinator.service.browsers import BrowserRefusal, HostNames, judge

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and metrics: the kubelet and Prometheus call them without a token."""


class Refusal(Exception):
    """A request the guard answers itself."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


class RequestGuard:
    """Pure ASGI middleware; see the module docstring for what it does, in order."""

    def __init__(self, app: ASGIApp, check: TokenCheck, max_body_bytes: int,
                 read_timeout_s: float, hosts: HostNames) -> None:
        self.app = app
        self.check = check
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            # Step 1 and 2: judged on the head alone.
            has_body = self._judge_head(scope)
            if not has_body:
                # Step 4.
                await self.app(scope, receive, send)
                return
            # Step 3.
            body = await self._read_body(receive)
        except Refusal as refusal:
            await _answer(send, refusal)
            return
        await self.app(scope, _replay(body, receive), send)

    def _judge_head(self, scope: Scope) -> bool:
        """Raise ``Refusal`` for a request refused on its head; return whether it has a body."""
        authorization: bytes | None = None
        length: bytes | None = None
        chunked = False
        host = origin = fetch_site = content_type = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                fetch_site = value
            elif name == b"content-type":
                content_type = value
        # Step 0.
        try:
            judge(self.hosts, scope["method"], host, origin, fetch_site, content_type)
        except BrowserRefusal as refusal:
            raise Refusal(refusal.status, refusal.detail) from None
        if scope["path"] not in PUBLIC_PATHS and not self.check.accepts(authorization):
            raise Refusal(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                          {"www-authenticate": "Bearer"})
        if length is not None:
            try:
                size = int(length)
            except ValueError:  # the HTTP parser refuses these first; never a 5xx here
                raise Refusal(400, "malformed Content-Length") from None
            if size > self.max_body_bytes:
                raise Refusal(413, f"request body of {size} bytes is over the limit of "
                              f"{self.max_body_bytes} bytes (max_body_bytes)")
            return size > 0
        return chunked

    async def _read_body(self, receive: Receive) -> bytes:
        deadline = time.monotonic() + self.read_timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except TimeoutError:
                raise Refusal(408, f"request body not received within {self.read_timeout_s} s "
                              "(read_timeout_s)") from None
            if message["type"] == "http.disconnect":
                raise Refusal(400, "client went away before sending its whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise Refusal(413, f"request body is over the limit of {self.max_body_bytes} "
                              "bytes (max_body_bytes)")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body read already, then the client's own messages
    (a disconnect, for handlers that wait)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


async def _answer(send: Send, refusal: Refusal) -> None:
    body = json.dumps({"detail": refusal.detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    headers += [(k.encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
