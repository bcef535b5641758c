"""Exceptions of the router_client package.

    RouterClientError
    ├── MalformedAnswer   a coordinator's answer (or an engine's handed-back event) lacks a
    │                     field this package needs, or has one of the wrong type
    ├── InvalidRequest    a request given to ``ContinuingClient`` that it cannot take (a
    │                     field it computes with has the wrong type); nothing was sent
    ├── UpstreamRejected  the upstream answered a request's first attempt with an error
    │                     status (after the retries a refusal gets); nothing was streamed
    └── StreamFailed      ``ContinuingClient.complete``: the stream ended in an error event
                          (a refusal to migrate, an upstream error, retries used up)

A coordinator that cannot be reached is not an error: the ``Watcher`` keeps trying in the
background, and says so in ``CoordinatorView.reachable``.
"""

from __future__ import annotations

from typing import Any


class RouterClientError(Exception):
    """Base class of every error this package raises on purpose."""


class MalformedAnswer(RouterClientError, ValueError):
    """A JSON document that does not have the form of the protocol (docs/protocol.md): the
    message names the document, the path to the field and what was wrong. Fields this package
    does not know are ignored; one it needs that is missing or mistyped is this error."""


class InvalidRequest(RouterClientError, ValueError):
    """A request body ``ContinuingClient`` cannot take: the message names the field and what
    was wrong (a proxy answers it with a 4xx)."""


class UpstreamRejected(RouterClientError):
    """The upstream answered the first attempt with a status other than 200, before any
    byte of a stream: ``status``, ``body`` and ``content_type`` are its answer, to relay."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"
                 ) -> None:
        super().__init__(f"upstream answered {status}: {body[:200]!r}")
        self.status = status
        self.body = body
        self.content_type = content_type


class StreamFailed(RouterClientError):
    """A collected (``stream: false``) request whose stream ended in an error event:
    ``event`` is that event (``{"error": {...}}``), ``reason`` its ``code`` (the refusal's
    reason, ``upstream_error``, ...)."""

    def __init__(self, event: dict[str, Any]) -> None:
        error = event.get("error")
        detail = error if isinstance(error, dict) else {}
        self.event = event
        self.reason = str(detail.get("code") or "upstream_error")
        super().__init__(str(detail.get("message") or event))
