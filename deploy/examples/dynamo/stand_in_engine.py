"""A stand-in for a real engine: deterministic token streams, and an abort.

Token ``k`` of a sequence depends only on the sequence's length, so a request continued on
another worker (its prompt extended by the tokens already streamed) yields exactly the rest of
the stream, and a client can check that nothing was lost or repeated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

FIRST_WORD_ID = 3
"""Token ids below this are special (unk, bos, eos) and never generated."""


def next_token(sequence_length: int, vocab_size: int) -> int:
    """The token that follows a sequence of ``sequence_length`` tokens (deterministic)."""
    return FIRST_WORD_ID + (sequence_length * 7) % (vocab_size - FIRST_WORD_ID)


class TokenEngine:
    """Stand-in for a real engine: streams tokens, one per ``delay_s``; can abort a request."""

    def __init__(self, vocab_size: int, delay_s: float) -> None:
        self.vocab_size = vocab_size
        self.delay_s = delay_s
        self.running: set[str] = set()
        self.aborted: list[str] = []

    async def generate(
        self, request_id: str, prompt: list[int], max_tokens: int
    ) -> AsyncIterator[int]:
        self.running.add(request_id)
        try:
            for i in range(max_tokens):
                await asyncio.sleep(self.delay_s)
                yield next_token(len(prompt) + i, self.vocab_size)
        finally:
            self.running.discard(request_id)

    def abort(self, request_id: str) -> None:
        # A real engine frees the request's KV cache and scheduler slot here.
        if request_id in self.running:
            self.aborted.append(request_id)
            self.running.discard(request_id)
