"""One HTTP client for every look the dev stack takes at its processes: a health or a
readiness poll, a coordinator's ``/status``, a router's worker list and worker API.

A client of its own per look (``httpx.get``) builds a TLS context every time, about 18 ms of
CPU on this project's 2-core test machine: polled every 20 ms, that is half a core taken
from the processes starting and serving on the same cores, which the benchmarks measure.
The looks are plain http on loopback, so one client serves them all, from any thread
(httpx's ``Client`` is thread-safe), for the life of the process; a pooled connection to a
process that has ended is found closed and dropped before it is used again.

    from devstack import looks
    looks.get(url)                     # httpx.Response; httpx.HTTPError as httpx raises
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

TIMEOUT_S = 5.0
"""One look at most."""

_lock = threading.Lock()
_client: httpx.Client | None = None


def client() -> httpx.Client:
    """The process's one client (made by the first look)."""
    global _client
    with _lock:
        if _client is None:
            _client = httpx.Client(timeout=TIMEOUT_S)
        return _client


def get(url: str, **kwargs: Any) -> httpx.Response:
    return client().get(url, **kwargs)
