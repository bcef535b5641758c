"""An upstream that streams one fixed chat answer, for what the simulated engine never
streams: a tool call. Run as its own process:

    python -m tests.continuation.scripted_upstream --ready-file F

``POST /v1/chat/completions``: a role chunk, one content token, a tool-call delta (name and
the start of its arguments), then the handed-back event, no ``[DONE]``: a drain that caught
the model mid-call. ``GET /requests`` says how many chat requests it was sent.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.continuation.serving import run

CONTENT = " Checking"
CALL = {"index": 0, "id": "call-1", "type": "function",
        "function": {"name": "lookup", "arguments": '{"city": "Par'}}


def _chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1,
            "model": "sim", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def script(request_id: str) -> list[dict[str, Any]]:
    return [_chunk({"role": "assistant", "content": ""}), _chunk({"content": CONTENT}),
            _chunk({"tool_calls": [CALL]}),
            {"handed_back": True, "request_id": request_id, "tokens": 4}]


def build_app() -> Starlette:
    count = {"chat": 0}

    async def chat(request: Request) -> Response:
        count["chat"] += 1
        request_id = request.headers.get("x-request-id", "scripted")

        async def events() -> AsyncIterator[bytes]:
            for event in script(request_id):
                yield f"data: {json.dumps(event)}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    async def requests(request: Request) -> Response:
        return JSONResponse(count)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/requests", requests, methods=["GET"])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", required=True)
    run(build_app(), parser.parse_args().ready_file)
