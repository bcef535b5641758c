"""Token generation for the simulated engine, and the one place requests are handed back.

Every completion runs through ``CompletionStreams.generate``. ``hand_back_all()`` ends every
in-flight stream before its next token (and any request that arrives afterwards at once),
which is what a drain asks of an engine: the stream's last event says how many tokens were
produced so the router can continue the request elsewhere. Whatever learns of the drain —
the main process's own SIGTERM handling, ``POST /internal/handoff``, or a worker client's
``shutdown_event`` through ``follow_shutdown_event`` — calls this one method.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from devstack.sim.tokens import TokenStream


@dataclass(frozen=True)
class Token:
    """One generated token; ``index`` counts from 0 and ``last`` marks ``max_tokens``."""

    text: str
    index: int
    last: bool
    aborted: bool = False
    """The engine aborted the request with this token (SGLang's ``/abort_request``): its
    chunk finishes with ``abort``."""


@dataclass(frozen=True)
class HandedBack:
    """The stream ended early because of a drain, after ``tokens`` tokens."""

    request_id: str
    tokens: int


@dataclass
class InflightRequest:
    request_id: str
    max_tokens: int
    started_at: float = field(default_factory=time.time)
    tokens: int = 0
    aborted: bool = False


HandoffListener = Callable[[HandedBack], None]
StepGate = Callable[[], Awaitable[object]]
"""Awaited before every token once the token interval has passed: a multi-node engine's
front end waits there for the collective step that produces the token (``devstack.sim.group``).
It may raise: the stream then fails, as a request does when its engine's ranks crash."""


class CompletionStreams:
    """Generates tokens at a fixed pace and hands every in-flight request back on demand."""

    def __init__(self, token_interval_s: float, hold_after_tokens: int = 0) -> None:
        self.token_interval_s = token_interval_s
        self.hold_after_tokens = hold_after_tokens
        """> 0: a stream waits after this many tokens until a hand-back ends it (the
        ``--hold-after-tokens`` knob, for tests that must not race the token clock)."""
        self.inflight: dict[int, InflightRequest] = {}
        """Keyed by an internal serial, so a retried request id never hides another."""
        self.handing_back = False
        self.completed = 0
        self.aborted: list[tuple[str, int]] = []
        """(request id, tokens streamed) of every request ``abort_all`` ended."""
        self.handed_back: list[HandedBack] = []
        self.listeners: list[HandoffListener] = []
        self.step_gate: StepGate | None = None
        """None (one process): a token is due when its interval has passed."""
        self._waiters: set[asyncio.Future[None]] = set()
        self._serial = 0

    async def generate(
        self, request_id: str, prompt: str, max_tokens: int
    ) -> AsyncIterator[Token | HandedBack]:
        """Yield ``max_tokens`` tokens, or fewer and then a ``HandedBack``."""
        request = InflightRequest(request_id=request_id, max_tokens=max_tokens)
        self._serial += 1
        key = self._serial
        self.inflight[key] = request
        stream = TokenStream(prompt)
        try:
            for index in range(max_tokens):
                held = self.hold_after_tokens > 0 and index == self.hold_after_tokens
                await self._pause(None if held else self.token_interval_s)
                if self.handing_back:
                    yield self._hand_back(request)
                    return
                request.tokens = index + 1
                if request.aborted:
                    self.aborted.append((request_id, request.tokens))
                    yield Token(stream.next_token(), index, False, aborted=True)
                    return
                yield Token(stream.next_token(), index, index == max_tokens - 1)
            self.completed += 1
        finally:
            self.inflight.pop(key, None)

    def hand_back_all(self) -> int:
        """End every in-flight stream before its next token; returns how many there were."""
        self.handing_back = True
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)
        return len(self.inflight)

    def abort_all(self) -> int:
        """End every in-flight request with its next token, as SGLang's ``POST
        /abort_request {"abort_all": true}`` does (its stream's last chunk finishes with
        ``abort``, then ``[DONE]``); requests that arrive later are served. Returns how many
        were in flight."""
        for request in self.inflight.values():
            request.aborted = True
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)
        return len(self.inflight)

    def resume(self) -> None:
        """Serve normally again (the drain was aborted)."""
        self.handing_back = False

    async def follow_shutdown_event(self, event: asyncio.Event) -> None:
        """Hand everything back the moment ``event`` is set (a worker client's drain signal)."""
        await event.wait()
        self.hand_back_all()

    def _hand_back(self, request: InflightRequest) -> HandedBack:
        handed = HandedBack(request.request_id, request.tokens)
        self.handed_back.append(handed)
        for listener in self.listeners:
            listener(handed)
        return handed

    async def _pause(self, seconds: float | None) -> None:
        """Sleep between tokens, cut short by ``hand_back_all``; ``None``: until then only
        (or until the request is cancelled, as a worker client's hand-back does)."""
        if self.handing_back:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = None if seconds is None else loop.call_later(seconds, _resolve, waiter)
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.discard(waiter)
        if self.step_gate is not None and not self.handing_back:
            await self._step_or_hand_back(self.step_gate)

    async def _step_or_hand_back(self, gate: StepGate) -> None:
        """Wait for the gate's step, cut short by ``hand_back_all`` (a hung step must not
        keep a drain from handing the request back)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        step = asyncio.ensure_future(gate())
        try:
            await asyncio.wait((step, waiter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.discard(waiter)
            if not step.done():
                step.cancel()
        if step.done() and not step.cancelled():
            step.result()  # the gate's error, if any, ends the stream


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
