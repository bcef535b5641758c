"""Bearer-token check for every call but ``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

SCHEME = "bearer "


class TokenCheck:
    """A FastAPI dependency; with no token configured it lets everything through."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def __call__(self, request: Request) -> None:
        if self._token is None:
            return
        header = request.headers.get("authorization", "")
        given = header[len(SCHEME):].strip() if header[:len(SCHEME)].lower() == SCHEME else ""
        # compare_digest on bytes: constant time in the token's length, whatever is given.
        if not given or not hmac.compare_digest(given.encode("utf-8", "replace"), self._token):
            raise HTTPException(
                status_code=401,
                detail="missing or invalid bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
