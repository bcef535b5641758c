"""The proxy's routes (Starlette).

    POST /v1/completions, POST /v1/chat/completions   through ContinuingClient: handed-back
                                                      streams continued through the upstream
    GET /health                                       the proxy is up
    GET /metrics                                      Prometheus text (metrics.py)
    anything else                                     forwarded to the upstream unchanged

A request the upstream rejects on its first attempt gets the upstream's own answer (status
and body); one whose stream cannot be continued ends, streamed, with an error event (and no
``[DONE]``), collected, with a 503 carrying that event (502 when the upstream's own stream
ended in an error).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from uuid import uuid4

import aiohttp
import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from continuation_proxy import metrics
from continuation_proxy.bodies import BadBody, Limits, parse_json, read_body
from router_client import ContinuingClient, InvalidRequest, StreamFailed, UpstreamRejected
from router_client.openai_requests import PATHS, check_request
from router_client.upstream import FAILED, HOP_BY_HOP

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
NOT_RELAYED = HOP_BY_HOP | {"content-encoding"}
"""An answer's headers not relayed: the connection's own, and its encoding (the session
decodes the body it relays)."""
FAILED_UPSTREAM = {"upstream_error", "upstream_malformed"}
"""Reasons that are the upstream's own failure (502); the rest are the continuation's (503)."""


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _relay(exc: UpstreamRejected) -> Response:
    return Response(exc.body, status_code=exc.status, media_type=exc.content_type)


def build_app(client: ContinuingClient, limits: Limits | None = None) -> Starlette:
    """The proxy's app: ``client`` continues, and its session forwards the rest to its
    upstream."""
    bounds = limits or Limits()

    async def continued(request: Request) -> Response:
        """1. Read and check the body (4xx on anything wrong with it).
        2. Name the request (its X-Request-Id, or a new one).
        3. Streamed: wait for the first chunk (a rejection is relayed as it came), then
           stream. Not streamed: collect the answer."""
        try:
            body = parse_json(await read_body(request, bounds), bounds)
        except BadBody as exc:
            return _error(exc.status, exc.detail)
        path = request.url.path
        problem = check_request(path, body)
        if problem:
            return _error(422, problem)
        request_id = request.headers.get("x-request-id") or f"cont-{uuid4().hex}"
        headers = {**request.headers, "x-request-id": request_id}
        answer_headers = {"X-Request-Id": request_id}
        try:
            if body.get("stream") is True:
                chunks = client.stream(path, body, headers)
                try:
                    first = await anext(chunks)
                except BaseException:
                    await chunks.aclose()
                    raise
                return StreamingResponse(_chain(first, chunks), media_type="text/event-stream",
                                         headers={**answer_headers, "Cache-Control": "no-cache"})
            return JSONResponse(await client.complete(path, body, headers),
                                headers=answer_headers)
        except UpstreamRejected as exc:
            return _relay(exc)
        except StreamFailed as exc:
            status = 502 if exc.reason in FAILED_UPSTREAM else 503
            return JSONResponse(exc.event, status_code=status, headers=answer_headers)
        except InvalidRequest as exc:
            return _error(422, str(exc))

    async def forward(request: Request) -> Response:
        """Any other call, to the upstream as it came; its answer as it comes back."""
        try:
            content = await read_body(request, bounds)
        except BadBody as exc:
            return _error(exc.status, exc.detail)
        query = request.url.query
        url = client.upstream + request.url.path + (f"?{query}" if query else "")
        sent = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            upstream = await client.session.request(request.method, url, headers=sent,
                                                    data=content or None,
                                                    allow_redirects=False)
        except FAILED as exc:
            return _error(502, f"upstream unreachable: {exc!r}")
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED}
        return StreamingResponse(_relayed(upstream), status_code=upstream.status,
                                 headers=kept)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "upstream": client.upstream})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(client.stats),
                        media_type=metrics.CONTENT_TYPE)

    return Starlette(routes=[
        *(Route(path, continued, methods=["POST"]) for path in PATHS),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/{path:path}", forward, methods=METHODS),
    ])


async def _chain(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """The first chunk (already read), then the rest; the rest (and with it the upstream
    stream) is closed however the response ends."""
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        # A client that goes away cancels the response's task, and anyio cancels every
        # await after that too: shielded, the upstream connection is still closed.
        with anyio.CancelScope(shield=True):
            await rest.aclose()


async def _relayed(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """A forwarded answer's bytes as they come; the upstream response released however the
    relay ends (its connection closed unless the body was read to its end)."""
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    finally:
        upstream.release()
