"""A stream's chunks collected into the one JSON answer of a ``stream: false`` request
(pure: no I/O).

    collector = Collector(CHAT)
    for chunk in chunks: collector.add(chunk)
    collector.answer()      # {"object": "chat.completion", "choices": [...], "usage": ...}

Completions join each choice's ``text`` (and ``logprobs`` lists, ``token_ids``); chats each
choice's message ``content`` (and reasoning, ``logprobs.content``), with tool calls put
together from their deltas by index, as engines do for a request that was not streamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router_client.openai_requests import COMPLETIONS
from router_client.stitching import REASONING_FIELDS

LOGPROB_LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
"""The parallel lists of a completion's ``logprobs``."""


@dataclass
class _Choice:
    index: int
    text: list[str] = field(default_factory=list)
    reasoning: dict[str, list[str]] = field(default_factory=dict)
    finish_reason: str | None = None
    stop_reason: Any = None
    logprobs: dict[str, list[Any]] | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Collector:
    """Gathers the client chunks of one request (``path`` one of ``PATHS``)."""

    path: str
    head: dict[str, Any] = field(default_factory=dict)
    """``id``, ``created``, ``model`` and the like, from the first chunk."""
    usage: dict[str, Any] | None = None
    _choices: dict[int, _Choice] = field(default_factory=dict)

    def add(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {k: v for k, v in chunk.items()
                         if k not in ("choices", "usage", "object", "prompt_token_ids")}
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            if isinstance(raw, dict):
                index = raw.get("index", 0)
                self._add(self._choices.setdefault(index, _Choice(index)), raw)
        if isinstance(chunk.get("prompt_token_ids"), list):  # vLLM chat: on the chunk
            self._choices.setdefault(0, _Choice(0)).prompt_token_ids = chunk["prompt_token_ids"]

    def _add(self, choice: _Choice, raw: dict[str, Any]) -> None:
        choice.finish_reason = raw.get("finish_reason") or choice.finish_reason
        choice.stop_reason = raw.get("stop_reason", choice.stop_reason)
        if isinstance(raw.get("token_ids"), list):
            choice.token_ids = [*(choice.token_ids or []), *raw["token_ids"]]
        if isinstance(raw.get("prompt_token_ids"), list):
            choice.prompt_token_ids = raw["prompt_token_ids"]
        logprobs = raw.get("logprobs")
        if self.path == COMPLETIONS:
            if isinstance(raw.get("text"), str):
                choice.text.append(raw["text"])
            if isinstance(logprobs, dict):
                into = choice.logprobs if choice.logprobs is not None else {}
                for name in LOGPROB_LISTS:
                    into.setdefault(name, []).extend(logprobs.get(name) or [])
                choice.logprobs = into
            return
        delta = raw.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            choice.text.append(delta["content"])
        for name in REASONING_FIELDS:
            if isinstance(delta.get(name), str):
                choice.reasoning.setdefault(name, []).append(delta[name])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_call(choice.tool_calls, call)
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            into = choice.logprobs if choice.logprobs is not None else {"content": []}
            into["content"].extend(logprobs["content"])
            choice.logprobs = into

    def answer(self) -> dict[str, Any]:
        """The whole answer, as the engine would have given it without streaming."""
        chat = self.path != COMPLETIONS
        choices = [self._choice(c, chat) for _, c in sorted(self._choices.items())]
        body = {**self.head, "object": "chat.completion" if chat else "text_completion",
                "choices": choices}
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    @staticmethod
    def _choice(choice: _Choice, chat: bool) -> dict[str, Any]:
        text = "".join(choice.text)
        out: dict[str, Any] = {"index": choice.index}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            for name, parts in choice.reasoning.items():
                message[name] = "".join(parts)
            if choice.tool_calls:
                message["tool_calls"] = [choice.tool_calls[i] for i in sorted(choice.tool_calls)]
                message["content"] = text or None
            out["message"] = message
        else:
            out["text"] = text
        out["logprobs"] = choice.logprobs
        out["finish_reason"] = choice.finish_reason
        if choice.stop_reason is not None:
            out["stop_reason"] = choice.stop_reason
        if choice.token_ids is not None:
            out["token_ids"] = choice.token_ids
        if choice.prompt_token_ids is not None:
            out["prompt_token_ids"] = choice.prompt_token_ids
        return out


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """One streamed tool-call delta into the call it belongs to (by ``index``): the first
    names it (``id``, ``type``, ``function.name``), the rest add to ``arguments``."""
    index = delta.get("index", len(calls))
    call = calls.setdefault(index, {"id": None, "type": "function",
                                    "function": {"name": None, "arguments": ""}})
    for name in ("id", "type"):
        if delta.get(name):
            call[name] = delta[name]
    function = delta.get("function")
    if isinstance(function, dict):
        if function.get("name"):
            call["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]
