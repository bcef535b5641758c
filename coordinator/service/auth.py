"""Bearer-token check for every call but ``/healthz``, ``/readyz`` and ``/metrics`` (made by
``coordinator.service.request_guard``)."""

from __future__ import annotations

import hmac

from shutdown_wire import BEARER

SCHEME = BEARER.lower() + " "
"""Compared without regard to case."""


class TokenCheck:
    """With no token configured it lets everything through."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def accepts(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value carries the token (or none is needed)."""
        if self._token is None:
            return True
        header = header or ""
        given = header[len(SCHEME):].strip() if header[:len(SCHEME)].lower() == SCHEME else ""
        # compare_digest on bytes: constant time in the token's length, whatever is given.
        return bool(given) and hmac.compare_digest(given.encode("utf-8", "replace"),
                                                   self._token)
