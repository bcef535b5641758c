"""The simulated engine's HTTP surface (Starlette): OpenAI-style streaming completions.

``POST /v1/completions`` ``{"prompt", "max_tokens", "stream"}``: with ``stream: true``,
server-sent events, one token each (``choices[0].text``), then ``data: [DONE]``. A stream
ended by a drain instead ends with ``{"handed_back": true, "request_id", "tokens"}`` and no
``[DONE]`` (see docs/architecture.md, "Engine ↔ router streaming convention"). The
``X-Request-Id`` header names the request. ``GET /health`` and two internal controls for
tests and hooks: ``POST /internal/stand_down`` (stand the child watchdog down) and
``POST /internal/handoff`` (hand every in-flight request back; ``/internal/resume`` undoes).
``POST /abort_request`` ``{"abort_all": true}``: SGLang's call, ending every in-flight stream
with its next token in a chunk whose ``finish_reason`` is ``abort``, then ``[DONE]``.
``GET /metrics``: the in-flight gauges in SGLang's Prometheus format (what SGLang serves with
``--enable-metrics``), so a coordinator's engine probe waits on the simulated engine as on a
real one. Chat completions and the calls real routers probe an engine with are
``openai_api.py``'s.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devstack.sim.openai_api import EngineControls, ServedModel, openai_routes
from devstack.sim.streams import CompletionStreams, HandedBack, Token
from devstack.sim.wire import (
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_LIMIT,
    MODEL_NAME,
    error,
    handed_back,
    parse_body,
    request_id,
    sse,
    sse_response,
)

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _chunk(request_id: str, created: int, token: Token) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": MODEL_NAME,
        "choices": [
            {
                "index": 0,
                "text": token.text,
                "logprobs": None,
                "finish_reason": ("abort" if token.aborted else "length" if token.last
                                  else None),
            }
        ],
    }


def _inflight_gauges(running: int) -> str:
    """SGLang's in-flight gauges as its ``/metrics`` shows them (``sglang:num_running_reqs``
    and ``sglang:num_queue_reqs``, sglang 0.5.23 observability/metrics_collector.py, with its
    tokenizer's labels); the simulated engine queues nothing."""
    labels = f'{{model_name="{MODEL_NAME}",engine_type="unified"}}'
    lines: list[str] = []
    for name, text, value in (
        ("sglang:num_running_reqs", "The number of running requests.", running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", 0),
    ):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name}{labels} {value:.1f}"]
    return "\n".join(lines) + "\n"


def _parse_completion(body: Any) -> tuple[str, int, bool] | str:
    """``(prompt, max_tokens, stream)`` from a request body, or what is wrong with it."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        return "'prompt' must be a string"
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        return "'max_tokens' must be an integer"
    if not 0 <= max_tokens <= MAX_TOKENS_LIMIT:
        return f"'max_tokens' must be between 0 and {MAX_TOKENS_LIMIT}"
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return "'stream' must be a boolean"
    return prompt, max_tokens, stream


def build_app(
    streams: CompletionStreams,
    controls: EngineControls,
    served: ServedModel | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The ASGI app of the main process; ``served`` describes it to routers' probes;
    ``extra_routes`` are a subclass's (a multi-node leader's ``/internal/group``)."""

    async def completions(request: Request) -> Response:
        parsed = await parse_body(request, _parse_completion)
        if isinstance(parsed, Response):
            return parsed
        prompt, max_tokens, stream = parsed
        rid = request_id(request, "cmpl")
        created = int(time.time())
        events = streams.generate(rid, prompt, max_tokens)
        if stream:
            return sse_response(_sse_events(rid, created, events), rid)
        return await _whole_completion(rid, created, events)

    async def health(request: Request) -> Response:
        return JSONResponse(controls.health())

    async def metrics(request: Request) -> Response:
        return Response(_inflight_gauges(len(streams.inflight)), media_type=PROMETHEUS_TEXT)

    async def stand_down(request: Request) -> Response:
        controls.stand_down_watchdog()
        return JSONResponse({"watchdog": "stood_down"})

    async def handoff(request: Request) -> Response:
        return JSONResponse({"handing_back": streams.hand_back_all()})

    async def resume(request: Request) -> Response:
        streams.resume()
        return JSONResponse({"handing_back": 0})

    async def abort_request(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or body.get("abort_all") is not True:
            return error(400, "only {\"abort_all\": true} is simulated")
        streams.abort_all()
        return Response(status_code=200)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, exc.detail)

    return Starlette(
        exception_handlers={HTTPException: http_error},
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/internal/stand_down", stand_down, methods=["POST"]),
            Route("/internal/handoff", handoff, methods=["POST"]),
            Route("/internal/resume", resume, methods=["POST"]),
            Route("/abort_request", abort_request, methods=["POST"]),
            *openai_routes(streams, controls, served or ServedModel()),
            *extra_routes,
        ],
    )


async def _sse_events(
    request_id: str, created: int, events: AsyncIterator[Token | HandedBack]
) -> AsyncIterator[bytes]:
    async for event in events:
        if isinstance(event, HandedBack):
            yield sse(handed_back(event))
            return
        yield sse(_chunk(request_id, created, event))
    yield sse("[DONE]")


async def _whole_completion(
    request_id: str, created: int, events: AsyncIterator[Token | HandedBack]
) -> Response:
    text: list[str] = []
    async for event in events:
        if isinstance(event, HandedBack):
            return JSONResponse({**handed_back(event), "text": "".join(text)})
        text.append(event.text)
    return JSONResponse(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": MODEL_NAME,
            "choices": [
                {"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": "length"}
            ],
            "usage": {"completion_tokens": len(text)},
        }
    )
