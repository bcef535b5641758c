"""Routers written by hand: ``--router KIND=URL`` flags and ``SHUTDOWN_COORDINATOR_ROUTERS``.

Settings text, read by ``settings.py``; the router adapters (``coordinator.service.
router_adapters``) only ever see the ``RouterSpec`` values made here.

    --router smg=http://smg.inference:30000
    --router vllm-router=http://vllm-router:8000
    SHUTDOWN_COORDINATOR_ROUTERS=smg=http://smg:30000,vllm-router=http://vllm-router:8000

The environment variable also takes a JSON list of such strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args
from urllib.parse import urlsplit

RouterKind = Literal["smg", "vllm-router", "reference"]
KINDS: tuple[str, ...] = get_args(RouterKind)
USAGE = "KIND=URL"
NEEDS_WORKER_URL = frozenset({"smg", "vllm-router"})
"""Kinds whose adapter names this pod's engine to the router (``--router-worker-url``);
the reference router learns of a drain from ``/status`` and needs no name."""


class RouterSyntaxError(ValueError):
    """A router written by hand that cannot be understood; the message says why."""


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """One router in front of this pod's engine."""

    kind: str
    """``smg`` (SGLang Model Gateway), ``vllm-router`` or ``reference``."""
    url: str
    """The router's own address (its control plane: ``/workers``, ``/remove_worker``)."""

    def __str__(self) -> str:
        return f"{self.kind}={self.url}"


def http_url(text: str) -> str:
    """``text`` without a trailing slash; ``ValueError`` unless it is an http(s) URL with a
    host."""
    url = text.strip().rstrip("/")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{text!r} holds a control character or whitespace (CR, LF, ...)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a port out of range)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host")
    return url


def parse_router(text: str) -> RouterSpec:
    """``KIND=URL`` → ``RouterSpec``; ``RouterSyntaxError`` saying what is wrong."""
    kind, sep, url = text.strip().partition("=")
    kind = kind.strip().lower()
    if not sep or not url.strip():
        raise RouterSyntaxError(f"{text!r} is not {USAGE} (KIND one of {', '.join(KINDS)})")
    if kind not in KINDS:
        raise RouterSyntaxError(f"{text!r}: unknown router kind {kind!r} (one of "
                                f"{', '.join(KINDS)})")
    try:
        return RouterSpec(kind, http_url(url))
    except ValueError as exc:
        raise RouterSyntaxError(f"{text!r}: {exc}") from None
