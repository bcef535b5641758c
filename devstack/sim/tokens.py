"""Deterministic tokens: the same context always yields the same next token.

The generator hashes the context with SHA-256 and derives each token from the digest of
what it has hashed so far, then feeds the token's text back into the hash. Because SHA-256
is a streaming hash, ``sha256(prompt)`` updated with ``t1``, ``t2`` … is in exactly the state
of ``sha256(prompt + t1 + t2 …)``: a request continued elsewhere with the text already
streamed appended to its prompt yields exactly the rest of the original stream. That is
what lets tests and the demo check that a migrated stream lost or repeated nothing.
"""

from __future__ import annotations

import hashlib

_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"


def _word(digest: bytes) -> str:
    """A pronounceable word of 1-3 syllables chosen by the digest."""
    syllables = 1 + digest[0] % 3
    parts = []
    for i in range(syllables):
        parts.append(_CONSONANTS[digest[1 + 2 * i] % len(_CONSONANTS)])
        parts.append(_VOWELS[digest[2 + 2 * i] % len(_VOWELS)])
    return "".join(parts)


class TokenStream:
    """The tokens that follow ``context``, one at a time. Each token is ``" " + word``."""

    def __init__(self, context: str) -> None:
        self._hash = hashlib.sha256(context.encode())

    def next_token(self) -> str:
        token = " " + _word(self._hash.copy().digest())
        self._hash.update(token.encode())
        return token


def expected_tokens(prompt: str, n: int) -> list[str]:
    """The first ``n`` tokens the simulated engine streams for ``prompt``."""
    stream = TokenStream(prompt)
    return [stream.next_token() for _ in range(n)]
