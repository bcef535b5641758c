"""An upstream that streams fixed answers, for what the simulated engine never streams: a tool
call, and token ids. Run as its own process:

    python -m tests.continuation.scripted_upstream --ready-file F

- ``POST /v1/chat/completions``: a role chunk, one content token, a tool-call delta (name and
  the start of its arguments), then the handed-back event, no ``[DONE]``: a drain that
  caught the model mid-call.
- ``POST /v1/completions`` with ``return_token_ids``, shaped as vLLM streams them (the first
  chunk carries ``prompt_token_ids``, each chunk its ``token_ids``): token ``i`` of the
  output is ``" t<i>"`` with id ``100 + i``, where ``i`` counts from the end of the prompt
  ``PROMPT_IDS`` (so a prompt of ``PROMPT_IDS`` and the first k output ids continues at
  token k). A text prompt is read as ``PROMPT_IDS``. After ``HAND_BACK_AT`` tokens of a
  request that starts at token 0 the stream is handed back; otherwise it ends with
  ``[DONE]``.
- ``GET /requests``: how many chat requests it was sent, and every completion body.
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
PROMPT_IDS = [1, 2, 3]
HAND_BACK_AT = 3


def _chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1,
            "model": "sim", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def chat_script(request_id: str) -> list[dict[str, Any] | str]:
    return [_chunk({"role": "assistant", "content": ""}), _chunk({"content": CONTENT}),
            _chunk({"tool_calls": [CALL]}),
            {"handed_back": True, "request_id": request_id, "tokens": 4}]


def completion_script(body: dict[str, Any], request_id: str) -> list[dict[str, Any] | str]:
    prompt = body["prompt"] if isinstance(body["prompt"], list) else PROMPT_IDS
    start = len(prompt) - len(PROMPT_IDS)
    events: list[dict[str, Any] | str] = []
    for n in range(body.get("max_tokens", 16)):
        if start == 0 and n == HAND_BACK_AT:
            return [*events, {"handed_back": True, "request_id": request_id, "tokens": n}]
        choice: dict[str, Any] = {"index": 0, "text": f" t{start + n}",
                                  "token_ids": [100 + start + n], "finish_reason": None}
        if n == 0:
            choice["prompt_token_ids"] = prompt
        events.append({"id": "cmpl-scripted", "object": "text_completion", "created": 1,
                       "model": "sim", "choices": [choice]})
    return [*events, "[DONE]"]


def _sse(events: list[dict[str, Any] | str]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for event in events:
            yield f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream")


def build_app() -> Starlette:
    seen: dict[str, Any] = {"chat": 0, "completions": []}

    async def chat(request: Request) -> Response:
        seen["chat"] += 1
        return _sse(chat_script(request.headers.get("x-request-id", "scripted")))

    async def completions(request: Request) -> Response:
        body = await request.json()
        seen["completions"].append(body)
        return _sse(completion_script(body, request.headers.get("x-request-id", "scripted")))

    async def requests(request: Request) -> Response:
        return JSONResponse(seen)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"]),
                             Route("/requests", requests, methods=["GET"])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", required=True)
    run(build_app(), parser.parse_args().ready_file)
