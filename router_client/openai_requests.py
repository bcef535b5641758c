"""OpenAI-style requests as a continuation sees them: are they well formed, can a handed-back
one be continued exactly, and what body continues it (pure functions, no I/O).

    problem = check_request(CHAT, body)             # None, or what is wrong (a 4xx)
    first = first_body(CHAT, body, ask_token_ids=True)
    refusal = request_refusal(CHAT, body)            # None, or why it cannot be migrated
    again = continuation_body(CHAT, body, streamed)  # the same request, from where it stopped

A completion is continued with the prompt followed by what was streamed: as token ids when
the stream gave them (exact), else as text; a chat completion with the conversation followed
by an open assistant message holding the streamed text, ``continue_final_message: true``
and ``add_generation_prompt: false`` (vLLM and SGLang both take these: vLLM's
``ChatCompletionRequest``, SGLang's ``serving_chat._handle_last_assistant_message``). Both
get ``max_tokens`` (and ``max_completion_tokens``, ``min_tokens``) reduced by the tokens
already streamed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PATHS = (COMPLETIONS, CHAT)
DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) ``max_tokens`` of a completion that does not say: a continuation
must say what is left of it, or the engine would start the default over."""


class Refusal(enum.StrEnum):
    """Why a handed-back stream is not continued: the error event's ``code``, the metric's
    ``reason``. Each is a request whose continuation could not be exact (``why``)."""

    N = "n"
    BEST_OF = "best_of"
    ECHO = "echo"
    BATCH_PROMPT = "batch_prompt"
    NO_PROMPT = "no_prompt"
    TOKEN_PROMPT = "token_prompt"
    TOOL_CALL = "tool_call"
    REASONING = "reasoning"
    ASSISTANT_PREFILL = "assistant_prefill"

    @property
    def why(self) -> str:
        return _WHY[self]


_WHY = {
    Refusal.N: "several choices (n > 1): one continuation per choice is not one stream",
    Refusal.BEST_OF: "best_of > 1: the engine picks the best of sequences the client never "
                     "saw, so there is no prefix to continue",
    Refusal.ECHO: "echo: the prompt is part of the output, and a continuation would echo "
                  "a longer one",
    Refusal.BATCH_PROMPT: "a list of prompts is several completions in one stream",
    Refusal.NO_PROMPT: "no text or token prompt to append the streamed text to",
    Refusal.TOKEN_PROMPT: "the prompt is token ids and the stream gave no token ids to "
                          "continue it with",
    Refusal.TOOL_CALL: "a tool call was being streamed: its arguments cannot be continued "
                       "as message text",
    Refusal.REASONING: "reasoning was streamed apart from the content: the open assistant "
                       "message would lose it, and each template renders it its own way",
    Refusal.ASSISTANT_PREFILL: "the client's own open assistant message is not plain text",
}


@dataclass(frozen=True)
class Streamed:
    """What one client stream received so far, across its upstream attempts."""

    text: str
    """Choice 0's text (completions) or message content (chat)."""
    tokens: int
    """Tokens streamed: the engines' counts at each hand-back, else the chunks counted."""
    token_ids: tuple[int, ...] | None = None
    """The output's token ids, when every chunk carried them (``return_token_ids``)."""
    prompt_token_ids: tuple[int, ...] | None = None
    """The prompt's token ids, as the first attempt's first chunk gave them."""


# -- checking ------------------------------------------------------------------------------


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _count(value: object) -> bool:
    """An integer >= 0 (JSON's true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _int_list(value: object) -> bool:
    return isinstance(value, list) and all(_count(v) for v in value)


def _typed(body: Mapping[str, Any], name: str, ok: bool, expected: str) -> str | None:
    if name in body and body[name] is not None and not ok:
        return f"'{name}' must be {expected}, got {_kind(body[name])}"
    return None


def check_request(path: str, body: object) -> str | None:
    """What is wrong with ``body`` as a request to ``path`` (one of ``PATHS``), or None.

    Only what a continuation computes with is checked (the upstream judges the rest):
    the body is an object; ``stream``, ``echo``, ``return_token_ids`` are booleans;
    ``max_tokens``, ``max_completion_tokens``, ``min_tokens``, ``n``, ``best_of`` are
    integers >= 0; ``stop`` is a string or a list of them; ``stream_options`` an object;
    a completion's ``prompt`` a string, token ids, or a list of either; a chat's
    ``messages`` a non-empty list of objects with a string ``role``."""
    if not isinstance(body, dict):
        return f"the body must be a JSON object, got {_kind(body)}"
    checks: list[str | None] = []
    for name in ("stream", "echo", "return_token_ids", "continue_final_message",
                 "add_generation_prompt"):
        checks.append(_typed(body, name, isinstance(body.get(name), bool), "true or false"))
    for name in ("max_tokens", "max_completion_tokens", "min_tokens", "n", "best_of"):
        checks.append(_typed(body, name, _count(body.get(name)), "an integer >= 0"))
    stop = body.get("stop")
    checks.append(_typed(body, "stop", isinstance(stop, str) or (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop)),
        "a string or a list of strings"))
    checks.append(_typed(body, "stream_options", isinstance(body.get("stream_options"), dict),
                         "an object"))
    if path == COMPLETIONS:
        prompt = body.get("prompt")
        checks.append(_typed(body, "prompt", isinstance(prompt, str) or _int_list(prompt) or (
            isinstance(prompt, list)
            and all(isinstance(p, str) or _int_list(p) for p in prompt)),
            "a string, a list of token ids, or a list of either"))
        checks.append(_typed(body, "logprobs", _count(body.get("logprobs")),
                             "an integer >= 0"))
    else:
        checks.append(_messages_problem(body.get("messages")))
        checks.append(_typed(body, "logprobs", isinstance(body.get("logprobs"), bool),
                             "true or false"))
    return next((c for c in checks if c), None)


def _messages_problem(messages: object) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list, got {_kind(messages)}"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{index}] must be an object with a string 'role'"
    return None


# -- refusing ------------------------------------------------------------------------------


def request_refusal(path: str, body: Mapping[str, Any]) -> Refusal | None:
    """Why this request, once handed back, cannot be continued exactly (None: it can).
    What was streamed may refuse it too (``stream_refusal``)."""
    if (body.get("n") or 1) > 1:
        return Refusal.N
    if (body.get("best_of") or 1) > 1:
        return Refusal.BEST_OF
    if body.get("echo"):
        return Refusal.ECHO
    if path == COMPLETIONS:
        prompt = body.get("prompt")
        if prompt is None:
            return Refusal.NO_PROMPT
        if isinstance(prompt, list) and not _int_list(prompt):
            return Refusal.BATCH_PROMPT
    elif _continues_own_message(body) and _text_of(body["messages"][-1].get("content")) is None:
        return Refusal.ASSISTANT_PREFILL
    return None


def stream_refusal(path: str, body: Mapping[str, Any], streamed: Streamed, *,
                   tool_call: bool, reasoning: bool) -> Refusal | None:
    """Why what was streamed cannot be continued exactly (None: it can)."""
    if tool_call:
        return Refusal.TOOL_CALL
    if reasoning:
        return Refusal.REASONING
    if path == COMPLETIONS and _int_list(body.get("prompt")) and streamed.tokens and (
            streamed.token_ids is None):
        return Refusal.TOKEN_PROMPT
    return None


def _continues_own_message(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(body.get("continue_final_message")) and messages[-1].get("role") == "assistant"


def _text_of(content: object) -> str | None:
    """A message's content as text (a string, or a list of text parts); None otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    return None


# -- bodies --------------------------------------------------------------------------------


def first_body(path: str, body: Mapping[str, Any], *, ask_token_ids: bool) -> dict[str, Any]:
    """The first upstream attempt: always streamed (a ``stream: false`` request is collected
    here, with usage asked for, to fill the answer's ``usage``); a completion asks for token
    ids (``return_token_ids``) when ``ask_token_ids`` and no ``stop`` string is set (vLLM
    holds text back near a stop string, so its ids would run ahead of the text sent)."""
    out = dict(body)
    if not body.get("stream"):
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    out["stream"] = True
    if ask_token_ids and wants_exact(path, body):
        out["return_token_ids"] = True
    return out


def wants_exact(path: str, body: Mapping[str, Any]) -> bool:
    """A request that token ids can continue exactly: a completion (the chat route takes no
    prompt ids) with no stop strings (see first_body)."""
    return path == COMPLETIONS and not body.get("stop")


def limit(path: str, body: Mapping[str, Any]) -> int | None:
    """The request's token limit (None: the engine's own, for a chat that does not say)."""
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return int(body[name])
    return DEFAULT_COMPLETION_MAX_TOKENS if path == COMPLETIONS else None


def continuation_body(path: str, first: Mapping[str, Any], streamed: Streamed) -> dict[str, Any]:
    """The request that continues ``first`` (the first attempt's body) after ``streamed``.

    1. The limits shrink by the tokens streamed (a completion's default made explicit).
    2. A completion's prompt: its token ids and the output's, when both are known (exact);
       else the prompt text followed by the streamed text.
    3. A chat's conversation: the streamed text as an open assistant message (appended to
       the client's own one when it already continued one), continued, no generation
       prompt."""
    out = dict(first)
    for name in ("max_tokens", "max_completion_tokens"):
        if first.get(name) is not None:
            out[name] = max(int(first[name]) - streamed.tokens, 0)
    if first.get("min_tokens"):
        out["min_tokens"] = max(int(first["min_tokens"]) - streamed.tokens, 0)
    if path == COMPLETIONS:
        if first.get("max_tokens") is None:
            out["max_tokens"] = max(DEFAULT_COMPLETION_MAX_TOKENS - streamed.tokens, 0)
        out["prompt"] = _continued_prompt(first["prompt"], streamed)
        return out
    messages: list[Any] = list(first["messages"])
    if _continues_own_message(first):
        own = messages[-1]
        messages[-1] = {**own, "content": (_text_of(own.get("content")) or "") + streamed.text}
    else:
        messages.append({"role": "assistant", "content": streamed.text})
    out.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return out


def _continued_prompt(prompt: str | Sequence[int], streamed: Streamed) -> str | list[int]:
    if streamed.token_ids is not None:
        prompt_ids = list(prompt) if _int_list(prompt) else streamed.prompt_token_ids
        if prompt_ids is not None:
            return [*prompt_ids, *streamed.token_ids]
    if isinstance(prompt, str):
        return prompt + streamed.text
    return list(prompt)  # token ids with no output ids: refused before (TOKEN_PROMPT)
