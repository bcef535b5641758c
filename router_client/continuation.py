"""Continue handed-back streams through any OpenAI-compatible router: a client for the router
that makes a stream a draining pod hands back arrive whole.

    client = ContinuingClient("http://smg:30000", coordinators=["http://pod-a:8787"])
    async for chunk in client.stream("/v1/chat/completions", body):   # SSE bytes
        ...
    answer = await client.complete("/v1/completions", body)          # stream: false

The router is the only upstream. When an upstream stream ends with the handed-back event
(docs/protocol.md) instead of ``[DONE]``, or breaks after it started, the request is sent to
the same router again, continued from what was streamed (``openai_requests``), and the new
attempt's chunks join the client's stream (``stitching``): one ``id``, no gap, no duplicate.
The router no longer sends work to the draining pod (its adapter took it out, or its health
check did), so the continuation lands on another one; an attempt it still sends there is
handed back before its first token, and is retried like a refusal. The handoff is
acknowledged to the coordinators, if any are named (``handoff_acks``).

A stream that cannot be continued exactly (``Refusal``: several choices, a tool call in
progress, ...) ends with an error event naming the reason, and no ``[DONE]``; so does one
whose retries or continuations ran out. ``stats`` counts all of it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

import shutdown_wire as wire
from router_client import sse
from router_client.collect import Collector
from router_client.errors import InvalidRequest, MalformedAnswer, StreamFailed, UpstreamRejected
from router_client.handoff_acks import HandoffAcks
from router_client.messages import HandedBack
from router_client.openai_requests import (
    PATHS,
    Refusal,
    check_request,
    continuation_body,
    first_body,
    limit,
    request_refusal,
    stream_refusal,
)
from router_client.stitching import Stitcher

Event = dict[str, Any] | str
"""A client event: a chunk (or error) object, or ``sse.DONE``."""

MAX_CONTINUATIONS = 8
"""Continuations of one stream before it fails: a pod hands a request back once; a few
drains in a row (a rolling update) or broken connections each add one."""
READ_TIMEOUT_S = 300.0
"""Longest silence inside an upstream stream (s) before it counts as broken: a long prompt's
prefill on a loaded engine comes first."""
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Answers that may pass: the router has no worker yet, or sent the attempt to one that is
going away. Any other status is the router's verdict on the request and is relayed."""
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding",
})  # fmt: skip
"""Headers that belong to one connection, never forwarded (RFC 9110 7.6.1), with the body's
length and encoding, which the proxy sets itself."""


@dataclass(frozen=True)
class RetryPolicy:
    """How an upstream attempt that is refused (an answer in ``RETRY_STATUSES``, no
    connection, handed back before its first token) is retried."""

    attempts: int = 8
    """Tries of one attempt in all."""
    within_s: float = 10.0
    """No new try after this long (s): about the router's own time to learn of a drain
    from its health check, far below a drain's migration budget."""
    first_wait_s: float = 0.05
    max_wait_s: float = 1.0
    """Waits double from ``first_wait_s`` up to this (s), with jitter, so continuations
    that a drain released together do not come back together."""

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.within_s),
            wait=wait_exponential_jitter(initial=self.first_wait_s, max=self.max_wait_s),
            retry=retry_if_exception_type(_Refused), reraise=True)


@dataclass
class ContinuationStats:
    """Counters of one client, for a proxy's metrics."""

    streams: int = 0
    """Requests taken (streamed or not)."""
    completed: int = 0
    """Ended with ``[DONE]`` (or collected whole)."""
    continuations: int = 0
    """Upstream attempts that continued a stream."""
    handed_back: int = 0
    """Upstream attempts that ended with the handed-back event."""
    broken: int = 0
    """Upstream streams that broke (connection lost, no ``[DONE]``) after they started."""
    upstream_retries: int = 0
    """Refused upstream attempts tried again."""
    tokens: int = 0
    """Tokens sent to clients."""
    refused: Counter[str] = field(default_factory=Counter)
    """Streams not migrated, by ``Refusal``."""
    failed: Counter[str] = field(default_factory=Counter)
    """Streams that ended in an error event for another reason, by reason."""


class _Refused(Exception):
    """An attempt that may pass if tried again; ``status`` and ``body`` say what happened."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"
                 ) -> None:
        super().__init__(f"{status}: {body[:300].decode(errors='replace')}")
        self.status, self.body, self.content_type = status, body, content_type


@dataclass
class _Attempt:
    """One upstream attempt, open, its first event read."""

    response: httpx.Response
    events: AsyncIterator[Event]
    first: Event | None
    outcome: str = "broken"
    """``done``, ``handed_back``, ``broken``, ``error`` (the upstream sent an error event)
    or ``malformed`` (not server-sent events of JSON)."""
    handed: HandedBack | None = None


class ContinuingClient:
    """Streams requests through ``upstream`` (a router's base URL) and continues those a
    draining pod hands back, through the same upstream."""

    def __init__(self, upstream: str, *, coordinators: Sequence[str] = (),
                 token: str | None = None, http: httpx.AsyncClient | None = None,
                 max_continuations: int = MAX_CONTINUATIONS, ask_token_ids: bool = True,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        self.upstream = upstream.rstrip("/")
        self.max_continuations = max_continuations
        self.ask_token_ids = ask_token_ids
        """Ask completions for token ids (``return_token_ids``: vLLM, SGLang) to continue
        them exactly; an engine that ignores it is continued by text."""
        self.retry = retry
        self.stats = ContinuationStats()
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=READ_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.acks = HandoffAcks(coordinators, token=token)

    async def __aenter__(self) -> ContinuingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.acks.close()
        if self._own_http:
            await self.http.aclose()

    async def stream(self, path: str, body: dict[str, Any],
                     headers: Mapping[str, str] | None = None) -> AsyncGenerator[bytes, None]:
        """The client's server-sent events: upstream attempts stitched, ending in ``[DONE]``
        or an error event. Raises ``InvalidRequest`` or ``UpstreamRejected`` before its
        first byte."""
        async with contextlib.aclosing(self.events(path, {**body, "stream": True},
                                                   headers)) as events:
            async for event in events:
                yield sse.encode(event)

    async def complete(self, path: str, body: dict[str, Any],
                       headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The whole answer of a ``stream: false`` request, collected from a stream that was
        continued the same way; raises ``StreamFailed`` where a stream would end in an
        error event."""
        collector = Collector(_path(path))
        async with contextlib.aclosing(self.events(path, {**body, "stream": False},
                                                   headers)) as events:
            async for event in events:
                if isinstance(event, str):
                    continue  # [DONE]: the last event; the stream counts itself done after it
                if "error" in event and not event.get("choices"):
                    raise StreamFailed(event)
                collector.add(event)
        return collector.answer()

    async def events(self, path: str, body: dict[str, Any],
                     headers: Mapping[str, str] | None = None) -> AsyncGenerator[Event, None]:
        """The client's events (see ``stream``).

        1. Check the request and name it (the caller's ``X-Request-Id``, or a new id);
           each upstream attempt is ``<id>.<n>``.
        2. Open an upstream attempt, retried while refused; the first attempt's rejection
           is raised, a continuation's ends the stream.
        3. Forward its chunks, stitched, until ``[DONE]``, an error, the handed-back event
           or a break.
        4. Handed back or broken: acknowledge, refuse what cannot be continued exactly,
           stop when nothing is left to generate, else continue (back to 2)."""
        path = _path(path)
        problem = check_request(path, body)
        if problem:
            raise InvalidRequest(problem)
        self.acks.start()
        self.stats.streams += 1
        request_id, sent = _upstream_headers(headers)
        first = first_body(path, body, ask_token_ids=self.ask_token_ids)
        stitcher = Stitcher(path, keep_token_ids=bool(body.get("return_token_ids")))
        serial = itertools.count()
        attempt_body = first
        for continuation in itertools.count():
            try:
                attempt = await self._open(path, attempt_body, sent, request_id, serial)
            except _Refused as exc:
                if not continuation:
                    raise UpstreamRejected(exc.status, exc.body, exc.content_type) from exc
                yield self._fail(request_id, "upstream_refused", f"upstream refused: {exc}")
                return
            except UpstreamRejected as exc:
                if not continuation:
                    raise
                yield self._fail(request_id, "upstream_rejected", str(exc))
                return
            async with contextlib.aclosing(self._forward(attempt, stitcher)) as chunks:
                async for chunk in chunks:
                    yield chunk
            if attempt.outcome == "done":
                self.stats.completed += 1
                return
            if attempt.outcome in ("error", "malformed"):
                self.stats.failed[f"upstream_{attempt.outcome}"] += 1
                if attempt.outcome == "malformed":
                    yield _error(request_id, "upstream_malformed", "continuation_failed",
                                 "the upstream stream is not server-sent events of JSON")
                return
            self._ended_early(attempt, stitcher)
            refusal = request_refusal(path, body) or stream_refusal(
                path, first, stitcher.streamed(), tool_call=stitcher.tool_call,
                reasoning=stitcher.reasoning)
            if refusal is not None:
                self.stats.refused[refusal] += 1
                yield _refused(request_id, refusal)
                return
            left = limit(path, first)
            if left is not None and left - stitcher.tokens <= 0:
                self.stats.completed += 1  # it was whole but for its [DONE]
                yield sse.DONE
                return
            if continuation >= self.max_continuations:
                yield self._fail(request_id, "too_many_continuations",
                                 f"handed back or broken {continuation + 1} times")
                return
            self.stats.continuations += 1
            attempt_body = continuation_body(path, first, stitcher.streamed())

    def _ended_early(self, attempt: _Attempt, stitcher: Stitcher) -> None:
        """Count and acknowledge an attempt that ended without ``[DONE]``."""
        if attempt.handed is not None:
            self._acknowledge(attempt.handed)
        else:
            self.stats.broken += 1
        stitcher.end_attempt(None if attempt.handed is None else attempt.handed.tokens)

    def _acknowledge(self, handed: HandedBack) -> None:
        self.stats.handed_back += 1
        self.acks.ack_later(handed.request_id)

    def _fail(self, request_id: str, reason: str, message: str) -> dict[str, Any]:
        self.stats.failed[reason] += 1
        return _error(request_id, reason, "continuation_failed", message)

    async def _open(self, path: str, body: dict[str, Any], headers: dict[str, str],
                    request_id: str, serial: Iterator[int]) -> _Attempt:
        """An upstream attempt, open; refused tries are retried (``retry``), each as a new
        upstream request (its own ``X-Request-Id``)."""
        async for retry in self.retry.retrying():
            with retry:
                if retry.retry_state.attempt_number > 1:
                    self.stats.upstream_retries += 1
                return await self._try_open(path, body, headers, f"{request_id}.{next(serial)}")
        raise AssertionError("tenacity re-raises the last refusal")  # pragma: no cover

    async def _try_open(self, path: str, body: dict[str, Any], headers: dict[str, str],
                        upstream_id: str) -> _Attempt:
        """1. Send the request; no connection is a refusal.
        2. Not 200: a status that may pass is a refusal, any other the upstream's verdict.
        3. Read the first event; a stream that ends or is handed back before it has any
           token is a refusal too (the router sent it to a pod that is going away)."""
        request = self.http.build_request("POST", self.upstream + path, json=body,
                                          headers={**headers, "X-Request-Id": upstream_id})
        try:
            response = await self.http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _Refused(502, _detail(f"upstream unreachable: {exc!r}")) from exc
        if response.status_code != 200:
            try:
                content = await response.aread()
            except httpx.TransportError:
                content = b""
            finally:
                await response.aclose()
            kind = response.headers.get("content-type", "application/json")
            if response.status_code in RETRY_STATUSES:
                raise _Refused(response.status_code, content, kind)
            raise UpstreamRejected(response.status_code, content, kind)
        events = sse.events(response.aiter_lines())
        try:
            first = await anext(events, None)
        except (httpx.TransportError, ValueError) as exc:
            await response.aclose()
            raise _Refused(502, _detail(f"upstream stream broke at once: {exc!r}")) from exc
        handed = _handed_back(first) if isinstance(first, dict) else None
        if first is None or (handed is not None and handed.tokens == 0):
            await response.aclose()
            if handed is not None:
                self._acknowledge(handed)
            raise _Refused(503, _detail("upstream ended the stream before its first token"))
        return _Attempt(response, events, first)

    async def _forward(self, attempt: _Attempt, stitcher: Stitcher
                       ) -> AsyncGenerator[Event, None]:
        """The attempt's chunks as the client gets them; ``attempt.outcome`` says how it
        ended. An upstream error event is passed on, and so is what follows it."""
        errored = False
        try:
            event = attempt.first
            while event is not None:
                if isinstance(event, str):  # [DONE]
                    attempt.outcome = "error" if errored else "done"
                    yield event
                    return
                if event.get(wire.HANDED_BACK):
                    attempt.handed = _handed_back(event)
                    attempt.outcome = "error" if errored else "handed_back"
                    return
                errored |= "error" in event and not event.get("choices")
                out = stitcher.take(event)
                if out is not None:
                    self.stats.tokens += stitcher.chunk_tokens(out)
                    yield out
                event = await anext(attempt.events, None)
            attempt.outcome = "error" if errored else "broken"
        except httpx.TransportError:
            attempt.outcome = "error" if errored else "broken"
        except ValueError:
            attempt.outcome = "malformed"
        finally:
            await attempt.response.aclose()


def _path(path: str) -> str:
    normal = "/" + path.strip("/")
    if normal not in PATHS:
        raise InvalidRequest(f"cannot continue {path!r}: only {', '.join(PATHS)}")
    return normal


def _upstream_headers(headers: Mapping[str, str] | None) -> tuple[str, dict[str, str]]:
    """The request's id and the headers every upstream attempt carries."""
    sent: dict[str, str] = {}
    request_id = ""
    for name, value in (headers or {}).items():
        lower = name.lower()
        if lower == "x-request-id":
            request_id = value
        elif lower not in HOP_BY_HOP:
            sent[name] = value
    return request_id or f"cont-{uuid4().hex}", sent


def _handed_back(event: dict[str, Any]) -> HandedBack | None:
    """The handed-back event, parsed; None for an ordinary chunk or a malformed one (which
    then counts as a broken stream: its tokens are not known)."""
    try:
        return HandedBack.from_event(event)
    except MalformedAnswer:
        return None


def _detail(message: str) -> bytes:
    return sse.encode({"detail": message})[len(b"data: "):-2]


def _error(request_id: str, code: str, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code,
                      "request_id": request_id}}


def _refused(request_id: str, refusal: Refusal) -> dict[str, Any]:
    return _error(request_id, refusal.value, "continuation_refused",
                  f"the stream was handed back and cannot be continued exactly: {refusal.why}")
