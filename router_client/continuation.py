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
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

import shutdown_wire as wire
from router_client import sse
from router_client.collect import Collector
from router_client.errors import InvalidRequest, StreamFailed, UpstreamRejected
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
    wants_exact,
)
from router_client.stitching import Stitcher
from router_client.upstream import (
    FAILED,
    Attempt,
    Event,
    Refused,
    RetryPolicy,
    Upstream,
    handed_back,
    new_session,
    upstream_headers,
)

MAX_CONTINUATIONS = 8
"""Continuations of one stream before it fails: a pod hands a request back once; a few
drains in a row (a rolling update) or broken connections each add one."""


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
    ended: int = 0
    """Upstream streams a draining pod's engine aborted (``finish_reason: "abort"`` while
    a watched coordinator ended its streams, ``--end-streams``)."""
    upstream_retries: int = 0
    """Refused upstream attempts tried again."""
    tokens: int = 0
    """Tokens sent to clients."""
    acked: int = 0
    """Handoffs a coordinator took (acknowledged, or remembered early)."""
    ended_acked: int = 0
    """Ended (or broken) streams taken over that the drain which ended them counted as
    continued."""
    ended_ambiguous: int = 0
    """Ended streams taken over but acknowledged to no drain: several had their window
    open at once."""
    refused: Counter[str] = field(default_factory=Counter)
    """Streams not migrated, by ``Refusal``."""
    failed: Counter[str] = field(default_factory=Counter)
    """Streams that ended in an error event for another reason, by reason."""


class ContinuingClient:
    """Streams requests through ``upstream`` (a router's base URL) and continues those a
    draining pod hands back, through the same upstream."""

    def __init__(self, upstream: str, *, coordinators: Sequence[str] = (),
                 token: str | None = None, session: aiohttp.ClientSession | None = None,
                 max_continuations: int = MAX_CONTINUATIONS, ask_token_ids: bool = True,
                 retry: RetryPolicy | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.max_continuations = max_continuations
        self.ask_token_ids = ask_token_ids
        """Ask completions for token ids (``return_token_ids``: vLLM, SGLang) to continue
        them exactly; an engine that ignores it is continued by text."""
        self.stats = ContinuationStats()
        self._session = session
        """The upstream's session (``upstream.new_session`` when none is given), made at
        the first request: aiohttp binds a session to the running event loop."""
        self.acks = HandoffAcks(coordinators, token=token, on_taken=self._taken,
                                on_continued=self._continued)
        self._own_session = session is None
        self._retry = retry or RetryPolicy()
        self._opened: Upstream | None = None

    async def __aenter__(self) -> ContinuingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.acks.close()
        if self._own_session and self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session every upstream attempt goes through."""
        if self._session is None:
            self._session = new_session()
        return self._session

    @property
    def _upstream(self) -> Upstream:
        if self._opened is None:
            self._opened = Upstream(self.upstream, self.session, self._retry,
                                    on_handed_back=self._acknowledge, on_retry=self._retried)
        return self._opened

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
        request_id, sent = upstream_headers(headers)
        first = first_body(path, body, ask_token_ids=self.ask_token_ids)
        stitcher = Stitcher(path, keep_token_ids=bool(body.get("return_token_ids")),
                            use_token_ids=wants_exact(path, body))
        ids = (f"{request_id}.{n}" for n in itertools.count())
        attempt_body = first
        ended_early: str | None = None
        """The id of the attempt that broke or was ended, until its continuation is taken."""
        for continuation in itertools.count():
            try:
                attempt = await self._upstream.open(path, attempt_body, sent, ids)
            except Refused as exc:
                if not continuation:
                    raise UpstreamRejected(exc.status, exc.body, exc.content_type) from exc
                yield self._fail(request_id, "upstream_refused", f"upstream refused: {exc}")
                return
            except UpstreamRejected as exc:
                if not continuation:
                    raise
                yield self._fail(request_id, "upstream_rejected", str(exc))
                return
            if ended_early is not None:
                self.acks.continued_later(ended_early)  # taken over: its drain may count it
                ended_early = None
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
            if attempt.handed is None:
                ended_early = attempt.request_id
            if left is not None and left - stitcher.tokens <= 0:
                self.stats.completed += 1  # it was whole but for its [DONE]
                if ended_early is not None:
                    self.acks.continued_later(ended_early)
                yield sse.DONE
                return
            if continuation >= self.max_continuations:
                yield self._fail(request_id, "too_many_continuations",
                                 f"handed back or broken {continuation + 1} times")
                return
            self.stats.continuations += 1
            attempt_body = continuation_body(path, first, stitcher.streamed())

    def _ended_early(self, attempt: Attempt, stitcher: Stitcher) -> None:
        """Count and acknowledge an attempt that ended without ``[DONE]``."""
        if attempt.handed is not None:
            self._acknowledge(attempt.handed)
        elif attempt.outcome == "ended":
            self.stats.ended += 1
        else:
            self.stats.broken += 1
        stitcher.end_attempt(None if attempt.handed is None else attempt.handed.tokens)

    def _acknowledge(self, handed: HandedBack) -> None:
        self.stats.handed_back += 1
        self.acks.ack_later(handed.request_id)

    def _retried(self) -> None:
        self.stats.upstream_retries += 1

    def _taken(self, count: int) -> None:
        self.stats.acked += count

    def _continued(self, counted: int, ambiguous: int) -> None:
        self.stats.ended_acked += counted
        self.stats.ended_ambiguous += ambiguous

    def _fail(self, request_id: str, reason: str, message: str) -> dict[str, Any]:
        self.stats.failed[reason] += 1
        return _error(request_id, reason, "continuation_failed", message)

    async def _forward(self, attempt: Attempt, stitcher: Stitcher
                       ) -> AsyncGenerator[Event, None]:
        """The attempt's chunks as the client gets them; ``attempt.outcome`` says how it
        ended. An upstream error event is passed on, and so is what follows it."""
        errored = False
        try:
            opening = iter(attempt.opening)
            while True:
                event = next(opening, None)
                if event is None and (event := await anext(attempt.events, None)) is None:
                    break
                if isinstance(event, str):  # [DONE]
                    attempt.outcome = "error" if errored else "done"
                    yield event
                    return
                if event.get(wire.HANDED_BACK):
                    attempt.handed = handed_back(event)
                    attempt.outcome = "error" if errored else "handed_back"
                    return
                errored |= "error" in event and not event.get("choices")
                if _aborted(event) and not errored and await self.acks.endings_open():
                    # A drain ended its engine's streams: this abort is a break to continue;
                    # its token (SGLang puts the last one in the abort chunk) is streamed.
                    attempt.outcome = "ended"
                    before = stitcher.sent
                    out = stitcher.take(_unfinished(event))
                    self.stats.tokens += stitcher.sent - before
                    if out is not None:
                        yield out
                    return
                before = stitcher.sent
                out = stitcher.take(event)
                self.stats.tokens += stitcher.sent - before
                if out is not None:
                    yield out
            attempt.outcome = "error" if errored else "broken"
        except FAILED:
            attempt.outcome = "error" if errored else "broken"
        except ValueError:
            attempt.outcome = "malformed"
        finally:
            attempt.response.release()


def _aborted(event: dict[str, Any]) -> bool:
    """Every choice of the chunk finished with ``abort``: the engine aborted the request."""
    choices = event.get("choices")
    return bool(choices) and isinstance(choices, list) and all(
        isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices)


def _unfinished(event: dict[str, Any]) -> dict[str, Any]:
    """The chunk as if it had not finished: what it streamed, without its ``abort``."""
    return {**event, "choices": [{**c, "finish_reason": None} for c in event["choices"]]}


def _path(path: str) -> str:
    normal = "/" + path.strip("/")
    if normal not in PATHS:
        raise InvalidRequest(f"cannot continue {path!r}: only {', '.join(PATHS)}")
    return normal


def _error(request_id: str, code: str, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code,
                      "request_id": request_id}}


def _refused(request_id: str, refusal: Refusal) -> dict[str, Any]:
    return _error(request_id, refusal.value, "continuation_refused",
                  f"the stream was handed back and cannot be continued exactly: {refusal.why}")
