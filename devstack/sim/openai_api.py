"""What real routers ask of an engine besides ``/v1/completions``: chat, the model list, and
the probes they detect a backend with.

The simulated engine presents itself as SGLang, the engine it is shaped like, and answers
the calls that SGLang Model Gateway (``smg``) and ``vllm-router`` make (docs/routers.md says
which router calls what, as seen from the running routers):

- ``GET /v1/models``: the one model, ``owned_by: "sglang"`` (how ``smg`` tells SGLang from
  vLLM), with ``root`` and ``max_model_len``;
- ``GET /server_info``, ``/get_server_info``: SGLang's server info (model path and name,
  ``tp_size``, ``dp_size``, ``version``, limits);
- ``GET /model_info``, ``/get_model_info``: SGLang's model info (``model_path``,
  ``is_generation``);
- ``GET /version``: ``{"version"}``;
- ``GET /health_generate``: 200 while serving, 503 once shutting down (SGLang's deep health
  check);
- ``POST /v1/chat/completions``: chat on the same deterministic tokens (``chat_template.py``).

Chat streams follow the completions' convention: one event per token (the first also
carries ``role: "assistant"``, so every chunk is exactly one token), then ``[DONE]``; a
handed-back stream ends with ``{"handed_back": true, "request_id", "tokens"}`` and no
``[DONE]``. ``continue_final_message: true`` (with ``add_generation_prompt: false``)
continues the last assistant message, as vLLM and SGLang do. ``stream_options:
{"include_usage": true}`` adds a last chunk with ``usage`` and no choices. Token counts of a
prompt are its whitespace-separated words (the engine has no tokenizer).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devstack.sim.chat_template import chat_context, parse_messages
from devstack.sim.streams import CompletionStreams, HandedBack, Token
from devstack.sim.wire import (
    MAX_TOKENS_LIMIT,
    MODEL_NAME,
    handed_back,
    parse_body,
    parse_max_tokens,
    request_id,
    sse,
    sse_response,
)

ENGINE_VERSION = "0.0.0-sim"
"""What ``/version`` and ``/server_info`` say."""


class EngineControls(Protocol):
    """What the HTTP layer needs from the main process besides token generation."""

    def stand_down_watchdog(self) -> bool: ...

    def health(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ServedModel:
    """How the engine describes itself to a router's probes."""

    name: str = MODEL_NAME
    tp_size: int = 1
    """Tensor-parallel ranks: the main process's schedulers."""
    dp_size: int = 1
    """Data-parallel ranks: the DP controller's schedulers, 1 without one."""
    context_length: int = MAX_TOKENS_LIMIT
    created: int = 0
    """When the model was loaded (Unix seconds), as ``/v1/models`` reports it."""


@dataclass(frozen=True)
class ChatRequest:
    context: str
    max_tokens: int
    stream: bool
    include_usage: bool


def parse_chat(body: Any) -> ChatRequest | str:
    """A chat completion request from its JSON body, or what is wrong with it."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    messages = parse_messages(body.get("messages"))
    if isinstance(messages, str):
        return messages
    flags: dict[str, bool] = {}
    for name, default in (("stream", False), ("continue_final_message", False),
                          ("add_generation_prompt", True)):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            return f"'{name}' must be a boolean"
        flags[name] = default if value is None else value
    if flags["continue_final_message"]:
        if messages[-1].role != "assistant":
            return "'continue_final_message' needs the last message to be the assistant's"
        if flags["add_generation_prompt"]:
            return "'continue_final_message' and 'add_generation_prompt' cannot both be true"
    if body.get("n") not in (None, 1):
        return "'n' must be 1: the simulated engine generates one choice"
    max_tokens = parse_max_tokens(body, "max_completion_tokens", "max_tokens")
    if isinstance(max_tokens, str):
        return max_tokens
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "'stream_options' must be an object"
    context = chat_context(
        messages,
        add_generation_prompt=flags["add_generation_prompt"],
        continue_final_message=flags["continue_final_message"],
    )
    return ChatRequest(context, max_tokens, flags["stream"],
                       bool(options and options.get("include_usage")))


def _usage(prompt: str, completion_tokens: int) -> dict[str, int]:
    prompt_tokens = len(prompt.split())
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def openai_routes(
    streams: CompletionStreams, controls: EngineControls, served: ServedModel
) -> list[Route]:
    """The routes above, for the main process's app."""

    async def chat_completions(request: Request) -> Response:
        chat = await parse_body(request, parse_chat)
        if isinstance(chat, Response):
            return chat
        rid = request_id(request, "chatcmpl")
        reply = _ChatReply(rid, int(time.time()), served.name, chat)
        events = streams.generate(rid, chat.context, chat.max_tokens)
        if chat.stream:
            return sse_response(reply.sse_events(events), rid)
        return await reply.whole(events)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": served.name, "object": "model", "created": served.created,
            "owned_by": "sglang", "root": served.name, "parent": None,
            "max_model_len": served.context_length,
        }]})  # fmt: skip

    async def server_info(request: Request) -> Response:
        return JSONResponse({
            "model_path": served.name, "tokenizer_path": served.name,
            "served_model_name": served.name, "tp_size": served.tp_size,
            "dp_size": served.dp_size, "pp_size": 1, "context_length": served.context_length,
            "max_total_tokens": served.context_length, "max_running_requests": 4096,
            "is_embedding": False, "disaggregation_mode": "null", "version": ENGINE_VERSION,
            "internal_states": [{"pid": controls.health().get("pid")}],
        })  # fmt: skip

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": served.name, "tokenizer_path": served.name,
                             "is_generation": True, "weight_version": "default"})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": ENGINE_VERSION})

    async def health_generate(request: Request) -> Response:
        health = controls.health()
        return JSONResponse(health, status_code=200 if health.get("status") == "ok" else 503)

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
    ]


@dataclass(frozen=True)
class _ChatReply:
    """The answer to one chat request, streamed or whole."""

    request_id: str
    created: int
    model: str
    chat: ChatRequest

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request_id, "object": "chat.completion.chunk",
                "created": self.created, "model": self.model, "choices": choices}

    def _token_chunk(self, token: Token) -> dict[str, Any]:
        delta = {"role": "assistant", "content": token.text} if token.index == 0 \
            else {"content": token.text}
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": ("abort" if token.aborted else
                                               "length" if token.last else None)}])

    async def sse_events(self, events: AsyncIterator[Token | HandedBack]) -> AsyncIterator[bytes]:
        produced = 0
        async for event in events:
            if isinstance(event, HandedBack):
                yield sse(handed_back(event))
                return
            produced += 1
            yield sse(self._token_chunk(event))
        if self.chat.include_usage:
            yield sse({**self._chunk([]), "usage": _usage(self.chat.context, produced)})
        yield sse("[DONE]")

    async def whole(self, events: AsyncIterator[Token | HandedBack]) -> Response:
        text: list[str] = []
        async for event in events:
            if isinstance(event, HandedBack):
                return JSONResponse({**handed_back(event), "text": "".join(text)})
            text.append(event.text)
        return JSONResponse({
            "id": self.request_id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                         "logprobs": None, "finish_reason": "length"}],
            "usage": _usage(self.chat.context, len(text)),
        })  # fmt: skip
