"""Exceptions of the router_client package.

    RouterClientError
    └── MalformedAnswer   a coordinator's answer (or an engine's handed-back event) lacks a
                          field this package needs, or has one of the wrong type

A coordinator that cannot be reached is not an error: the ``Watcher`` keeps trying in the
background, and says so in ``CoordinatorView.reachable``.
"""

from __future__ import annotations


class RouterClientError(Exception):
    """Base class of every error this package raises on purpose."""


class MalformedAnswer(RouterClientError, ValueError):
    """A JSON document that does not have the form of the protocol (docs/protocol.md): the
    message names the document, the path to the field and what was wrong. Fields this package
    does not know are ignored; one it needs that is missing or mistyped is this error."""
