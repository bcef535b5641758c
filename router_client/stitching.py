"""One client stream made of several upstream attempts: what each chunk adds, and the chunk
as the client gets it (pure: no I/O).

The client sees one stream: every chunk has the first attempt's ``id`` and ``created``; a
continuation does not say ``role`` again (a chat continuation's first chunk, role only, is
dropped), does not repeat what belongs to the prompt (``prompt_token_ids``,
``prompt_logprobs``), counts its ``usage`` from the first prompt (the tokens streamed before
it move from prompt to completion), and a completion's ``logprobs.text_offset`` goes on from
the text already streamed. Token ids the client did not ask for (the continuation asked for
them, to continue exactly) are taken out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router_client.openai_requests import COMPLETIONS, Streamed

PROMPT_FIELDS = ("prompt_token_ids", "prompt_logprobs", "prompt_text")
"""What an engine says of the prompt (vLLM): the client had it with the first attempt."""
REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where vLLM and SGLang stream a reasoning model's thinking, apart from ``content``."""


@dataclass
class Stitcher:
    """The state of one client stream across its attempts."""

    path: str
    keep_token_ids: bool
    """The client asked for token ids itself (``return_token_ids``): they stay."""
    use_token_ids: bool = True
    """Continue by token ids when the chunks carry them (``openai_requests.wants_exact``)."""
    prompt_ids: tuple[int, ...] | None = None
    attempt: int = 0
    """0 for the first upstream attempt, then one more per continuation."""
    id: str | None = None
    created: int | None = None
    tool_call: bool = False
    """A chat delta carried ``tool_calls``."""
    reasoning: bool = False
    """A chat delta carried reasoning text."""
    tokens: int = 0
    """Tokens of the attempts before this one."""
    sent: int = 0
    """Tokens sent to the client (choice 0's): its token ids, else one per chunk with
    text."""
    _text: list[str] = field(default_factory=list)
    _chars: int = 0
    _ids: list[int] | None = field(default_factory=list)
    """Output token ids so far; None once a chunk with text came without them."""
    _attempt_ids: list[int] = field(default_factory=list)
    _attempt_chunks: int = 0
    _attempt_chars: int = 0
    """Characters streamed before this attempt (where its ``text_offset`` starts)."""

    def __post_init__(self) -> None:
        if not self.use_token_ids:
            self._ids = None

    @property
    def text(self) -> str:
        return "".join(self._text)

    def streamed(self) -> Streamed:
        ids = None if self._ids is None else tuple(self._ids)
        return Streamed(self.text, self.tokens, ids, self.prompt_ids)

    def take(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Record an upstream chunk; return it as the client gets it (None: nothing to send).

        1. The first chunk ever gives the stream its ``id`` and ``created``; every later
           one gets them.
        2. Choice 0's text (or delta content) and token ids are recorded; a tool call or
           reasoning is noted.
        3. In a continuation: prompt fields go, ``role`` goes, offsets and usage shift.
        4. Token ids the client did not ask for go."""
        if self.id is None:
            self.id, self.created = event.get("id"), event.get("created")
        else:
            event["id"], event["created"] = self.id, self.created
        if self.attempt:
            for name in PROMPT_FIELDS:
                event.pop(name, None)
            _shift_usage(event.get("usage"), self.tokens)
        choices = event.get("choices")
        empty = False
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    empty |= self._choice(choice, first=choice.get("index", 0) == 0)
        if not self.keep_token_ids:
            event.pop("prompt_token_ids", None)
        if empty and len(choices or ()) == 1 and not event.get("usage"):
            return None
        return event

    def _choice(self, choice: dict[str, Any], first: bool) -> bool:
        """Record and rewrite one choice; True when it is a continuation's role-only chunk."""
        if self.attempt:
            for name in PROMPT_FIELDS:
                choice.pop(name, None)
        ids = choice.get("token_ids")
        if not self.keep_token_ids:
            choice.pop("token_ids", None)
            if not self.attempt:
                prompt_ids = choice.pop("prompt_token_ids", None)
                if first and isinstance(prompt_ids, list):
                    self.prompt_ids = tuple(prompt_ids)
        elif first and not self.attempt and isinstance(choice.get("prompt_token_ids"), list):
            self.prompt_ids = tuple(choice["prompt_token_ids"])
        if self.path == COMPLETIONS:
            text = choice.get("text")
            if self.attempt:
                _shift_offsets(choice.get("logprobs"), self._attempt_chars)
        else:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                return False
            text = delta.get("content")
            self.tool_call |= bool(delta.get("tool_calls")) and first
            self.reasoning |= any(delta.get(name) for name in REASONING_FIELDS) and first
            if self.attempt and delta.pop("role", None) is not None and not text and not (
                    set(delta) - {"content"}) and choice.get("finish_reason") is None:
                return True
        if first:
            self._record(text if isinstance(text, str) else "", ids)
        return False

    def _record(self, text: str, ids: object) -> None:
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            self._attempt_ids += ids
            self.sent += len(ids)
        else:
            self.sent += bool(text)
            if text and self._ids is not None:
                self._ids = None  # a token without its id: continue by text
        if text:
            self._attempt_chunks += 1
            self._text.append(text)
            self._chars += len(text)

    def end_attempt(self, engine_tokens: int | None) -> None:
        """The attempt ended without ``[DONE]``: count its tokens (the engine's count from
        its handed-back event, else its token ids, else its chunks) and start the next."""
        if engine_tokens is not None:
            counted = engine_tokens
        elif self._attempt_ids:
            counted = len(self._attempt_ids)
        else:
            counted = self._attempt_chunks
        self.tokens += counted
        if self._ids is not None:
            self._ids += self._attempt_ids
            if engine_tokens is not None and len(self._attempt_ids) != engine_tokens:
                self._ids = None  # ids held back or lost: they no longer match the count
        self._attempt_ids, self._attempt_chunks = [], 0
        self._attempt_chars = self._chars
        self.attempt += 1


def _shift_usage(usage: object, earlier: int) -> None:
    """The usage of a continuation counted from the first prompt: its prompt held the
    ``earlier`` tokens, which the client counts as completion."""
    if not isinstance(usage, dict) or not earlier:
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["prompt_tokens"] = max(prompt - earlier, 0)
        usage["completion_tokens"] = completion + earlier


def _shift_offsets(logprobs: object, chars: int) -> None:
    """A completion's ``text_offset`` runs from the start of its attempt's output; the
    client's from the start of the whole text."""
    if isinstance(logprobs, dict) and isinstance(logprobs.get("text_offset"), list):
        logprobs["text_offset"] = [o + chars if isinstance(o, int) else o
                                   for o in logprobs["text_offset"]]
