"""Upstream attempts of a continued stream: each one opened, its first event read, and
retried while the upstream refuses it.

A refusal is what may pass if tried again: no connection, an answer in ``RETRY_STATUSES``
(the router has no worker yet, or sent the attempt to one going away), or a stream handed
back (or ended) before its first token (the router still sends work to a draining pod).
Each try is a new upstream request with an ``X-Request-Id`` of its own, so every handoff an
engine reports has its own id. Any other status is the upstream's verdict on the request:
``UpstreamRejected``, not retried.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

import shutdown_wire as wire
from router_client import sse
from router_client.errors import MalformedAnswer, UpstreamRejected
from router_client.messages import HandedBack

Event = dict[str, Any] | str
"""An event of a stream: a chunk (or error) object, or ``sse.DONE``."""

READ_TIMEOUT_S = 300.0
"""Longest silence inside an upstream stream (s) before it counts as broken: a long prompt's
prefill on a loaded engine comes first."""
CONNECT_TIMEOUT_S = 10.0
"""Longest wait for a connection to the upstream (s)."""
MAX_ANSWER_BYTES = 1 << 20
"""Most of a refusing or rejecting answer's body kept (relayed to the client, or retried):
an upstream's error page, not a stream of its own; the rest is not read."""
FAILED = (aiohttp.ClientError, asyncio.TimeoutError)
"""What an upstream call raises when the connection fails, breaks or times out."""
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Answers that may pass: the router has no worker yet, or sent the attempt to one that is
going away. Any other status is the router's verdict on the request and is relayed."""
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding",
})  # fmt: skip
"""Headers that belong to one connection, never forwarded (RFC 9110 7.6.1), with the body's
length and encoding, which the sender sets itself."""


class Refused(Exception):
    """An attempt that may pass if tried again; ``status`` and ``body`` say what happened."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"
                 ) -> None:
        super().__init__(f"{status}: {body[:300].decode(errors='replace')}")
        self.status, self.body, self.content_type = status, body, content_type


@dataclass(frozen=True)
class RetryPolicy:
    """How an upstream attempt that is refused is retried."""

    attempts: int = 8
    """Tries of one attempt in all."""
    within_s: float = 10.0
    """No new try after this long (s): about the router's own time to learn of a drain
    from its health check, far below a drain's migration budget."""
    first_wait_s: float = 0.05
    max_wait_s: float = 1.0
    """Waits double from ``first_wait_s`` up to this (s), each plus up to ``first_wait_s``
    of jitter, so continuations that a drain released together do not come back
    together."""

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.within_s),
            # Jitter of one first wait at most: enough to spread a drain's burst, small
            # enough to keep the doubling.
            wait=wait_exponential(multiplier=self.first_wait_s, max=self.max_wait_s)
            + wait_random(0, self.first_wait_s),
            retry=retry_if_exception_type(Refused), reraise=True)


@dataclass
class Attempt:
    """One upstream attempt, open, its first event read."""

    response: aiohttp.ClientResponse
    """Released when the attempt ends: its connection goes back to the pool only when the
    body was read to its end (aiohttp closes it otherwise)."""
    events: AsyncIterator[Event]
    opening: list[Event]
    """The events read before the attempt was known to be taken (``_opening``)."""
    outcome: str = "broken"
    """How it ended: ``done``, ``handed_back``, ``broken``, ``ended`` (aborted by the engine
    while a drain that ends streams had its window open), ``error`` (the upstream sent an
    error event) or ``malformed`` (not server-sent events of JSON)."""
    handed: HandedBack | None = None
    request_id: str = ""
    """The ``X-Request-Id`` it was sent with."""


class Upstream:
    """Opens attempts on ``url`` (a router's base URL)."""

    def __init__(self, url: str, session: aiohttp.ClientSession, retry: RetryPolicy, *,
                 on_handed_back: Callable[[HandedBack], None],
                 on_retry: Callable[[], None]) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.retry = retry
        self.on_handed_back = on_handed_back
        """Told of a stream handed back before its first token (to count and acknowledge
        it: its engine reported it to its coordinator like any other)."""
        self.on_retry = on_retry

    async def open(self, path: str, body: dict[str, Any], headers: Mapping[str, str],
                   ids: Iterator[str]) -> Attempt:
        """An attempt, open; refused tries are retried (``retry``), each with the next of
        ``ids`` as its ``X-Request-Id``. Raises the last ``Refused`` when the policy gives
        up, ``UpstreamRejected`` at once for any other answer but 200."""
        async for retry in self.retry.retrying():
            with retry:
                if retry.retry_state.attempt_number > 1:
                    self.on_retry()
                return await self._try(path, body, headers, next(ids))
        raise AssertionError("tenacity re-raises the last refusal")  # pragma: no cover

    async def _try(self, path: str, body: dict[str, Any], headers: Mapping[str, str],
                   upstream_id: str) -> Attempt:
        """1. Send the request; no connection is a refusal.
        2. Not 200: a status that may pass is a refusal, any other the upstream's verdict.
        3. Read the first event; a stream that ends or is handed back before it has any
           token is a refusal too."""
        sent = {**headers, "X-Request-Id": upstream_id, "Content-Type": "application/json"}
        try:
            response = await self.session.post(
                self.url + path, data=json.dumps(body, separators=(",", ":")).encode(),
                headers=sent, allow_redirects=False)
        except FAILED as exc:
            raise Refused(502, _detail(f"upstream unreachable: {exc!r}")) from exc
        if response.status != 200:
            try:
                content = await _head(response.content, MAX_ANSWER_BYTES)
            except FAILED:
                content = b""
            finally:
                response.release()
            kind = response.headers.get("content-type", "application/json")
            if response.status in RETRY_STATUSES:
                raise Refused(response.status, content, kind)
            raise UpstreamRejected(response.status, content, kind)
        events = sse.events_of_bytes(response.content.iter_any())
        try:
            opening = await _opening(events)
        except (*FAILED, ValueError) as exc:
            response.release()
            raise Refused(502, _detail(f"upstream stream broke at once: {exc!r}")) from exc
        last = opening[-1] if opening else None
        handed = handed_back(last) if isinstance(last, dict) else None
        if last is None or (handed is not None and handed.tokens == 0):
            response.release()
            if handed is not None:
                self.on_handed_back(handed)
            raise Refused(503, _detail("upstream ended the stream before its first token"))
        return Attempt(response, events, opening, request_id=upstream_id)


async def _head(body: aiohttp.StreamReader, limit: int) -> bytes:
    """The first ``limit`` bytes of ``body`` (all of it when shorter)."""
    kept = bytearray()
    while len(kept) < limit and (chunk := await body.read(limit - len(kept))):
        kept += chunk
    return bytes(kept)


def new_session() -> aiohttp.ClientSession:
    """A session for an upstream: no limit on connections (each stream holds one), kept
    alive between requests, and a stream's silence bounded by ``READ_TIMEOUT_S``."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S,
                                      sock_read=READ_TIMEOUT_S))


def upstream_headers(headers: Mapping[str, str] | None) -> tuple[str, dict[str, str]]:
    """The request's id (its ``X-Request-Id``, or a new one) and the headers every upstream
    attempt carries (the caller's, but for the connection's own)."""
    sent: dict[str, str] = {}
    request_id = ""
    for name, value in (headers or {}).items():
        lower = name.lower()
        if lower == "x-request-id":
            request_id = value
        elif lower not in HOP_BY_HOP and lower != "content-type":  # the body is ours
            sent[name] = value
    return request_id or f"cont-{uuid4().hex}", sent


def handed_back(event: dict[str, Any]) -> HandedBack | None:
    """The handed-back event, parsed; None for an ordinary chunk or a malformed one (which
    then counts as a broken stream: its tokens are not known)."""
    try:
        return HandedBack.from_event(event)
    except MalformedAnswer:
        return None


OPENING_EVENTS = 8
"""Events read, at most, before an attempt counts as taken: a chat stream opens with a
role-only chunk (vLLM), and one more says whether a token or the hand-back follows."""


async def _opening(events: AsyncIterator[Event]) -> list[Event]:
    """The stream's first events, up to and including the first that says the attempt was
    taken or not: a token, the end, an error, the hand-back (or ``OPENING_EVENTS`` of
    them); empty when the stream ended at once."""
    opening: list[Event] = []
    async for event in events:
        opening.append(event)
        if len(opening) >= OPENING_EVENTS or not _empty(event):
            break
    return opening


def _empty(event: Event) -> bool:
    """A chunk that carries nothing yet: no text, no delta but ``role``, no finish, no
    usage (vLLM's first chat chunk, ``{"role": "assistant", "content": ""}``)."""
    if not isinstance(event, dict) or set(event) & {"usage", "error", wire.HANDED_BACK}:
        return False
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("finish_reason") or choice.get("text"):
            return False
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return False
    return bool(event.get("choices"))


def _detail(message: str) -> bytes:
    return sse.encode({"detail": message})[len(b"data: "):-2]
