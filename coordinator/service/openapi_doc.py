"""What the OpenAPI document says beyond the routes: the answers every operation can give
before its handler runs (the request guard's and the connection bounds'), and the bearer
token as a security scheme on every operation but the probes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from coordinator.service.request_guard import PUBLIC_PATHS


class Problem(BaseModel):
    """An error: what went wrong, in words."""

    detail: str


def _answer(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


AT_THE_DOOR: dict[int | str, dict[str, Any]] = {
    403: _answer("a browser made the request for another site (Sec-Fetch-Site, Origin); "
                 "without the token, a caller acting on a process it could not signal"),
    415: _answer("a web form's body (urlencoded, multipart, text/plain)"),
    421: _answer("a Host the coordinator does not answer to (--allowed-host)"),
    431: _answer("request head over 64 KiB"),
    503: _answer("too many open connections (max_connections)"),
}
"""Answers any request can get from the connection bounds."""

GUARDED: dict[int | str, dict[str, Any]] = {
    401: _answer("missing or invalid bearer token"),
    408: _answer("request body not received within read_timeout_s"),
    413: _answer("request body over max_body_bytes"),
    **AT_THE_DOOR,
}
"""Answers the request guard gives before any handler of a token-protected operation."""

def limited(setting: str) -> dict[int | str, dict[str, Any]]:
    """The 429 of an operation bounded by ``setting`` (with ``Retry-After``)."""
    return {429: {"model": Problem, "description": f"the {setting} limit is reached; retry "
                  "after the Retry-After seconds"}}


SCHEME = "bearer"


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (built once): the bearer scheme is declared, and every
    operation outside ``PUBLIC_PATHS`` requires it."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema.setdefault("components", {})["securitySchemes"] = {
            SCHEME: {"type": "http", "scheme": "bearer",
                     "description": "the coordinator's token (--token-file)"}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                operation["security"] = [] if path in PUBLIC_PATHS else [{SCHEME: []}]
        app.openapi_schema = schema
    return app.openapi_schema
