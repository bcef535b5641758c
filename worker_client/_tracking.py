"""Track each request's generation and end it when a drain starts.

A tracked request is interruptible only while it waits on the engine (inside
``Request.stream``'s next item or ``Request.run``'s awaitable): the drain cancels the task
right there, so the engine's own generation sees the cancellation and stops. A request that is
elsewhere (its token being written to the client) sees the drain before it asks for the next
token. Nothing is allocated per token: the check is one attribute read.

The drain is a level, not an edge: a request that enters after the drain started — even one
whose engine request id does not exist yet — is handed back at its first step.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Literal, TypeVar

from worker_client.errors import HandedBack

T = TypeVar("T")

HANDOFF_CANCEL_MSG = "worker_client: handed back by a drain"

_task_on: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]
"""The task running on a loop now: ``asyncio.current_task`` where it is C (3.12+); on 3.11
the dict that its pure-Python ``current_task`` reads, looked up directly (one lookup instead
of two Python calls, on every wait of every stream)."""
_current_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = getattr(
    asyncio.tasks, "_current_tasks", None)
if sys.version_info >= (3, 12) or _current_tasks is None:
    _task_on = asyncio.current_task
else:
    _task_on = _current_tasks.get

Ack = Literal["router", "engine"]
"""Who acknowledges a handoff: a router that reads ``/status`` (``router``, the default), or
the engine's own router, which migrates the stream by itself and never tells the coordinator
(``engine``: the handoff is reported already settled)."""


class Tracker:
    """The worker's in-flight requests and whether a drain is on."""

    def __init__(
        self,
        on_inflight: Callable[[int], None],
        on_handoff: Callable[[str | None, int, str, Ack], None],
    ) -> None:
        self.shutting_down = False
        self.inflight = 0
        self._active: set[Request] = set()
        # enter/leave may come from several threads in engines that are not asyncio.
        self._lock = threading.Lock()
        self._on_inflight = on_inflight
        self._on_handoff = on_handoff

    def interrupt_all(self) -> None:
        """Run on the engine's loop when the drain starts: stop every waiting generation."""
        self.shutting_down = True
        for request in list(self._active):
            request._interrupt()

    def resume(self) -> None:
        """The drain was aborted: new requests are served normally again."""
        self.shutting_down = False

    def enter(self, request: Request) -> None:
        with self._lock:
            self._active.add(request)
            self.inflight += 1
            inflight = self.inflight
        self._on_inflight(inflight)

    def leave(self, request: Request) -> None:
        with self._lock:
            self._active.discard(request)
            self.inflight -= 1
            inflight = self.inflight
        if request.handed_back:
            self._on_handoff(request.request_id, request.tokens, request.detail,
                             request.ack)
        self._on_inflight(inflight)


class Request:
    """One tracked request: its id (settable later), tokens produced, whether handed back."""

    def __init__(self, tracker: Tracker, request_id: str | None, ack: Ack = "router") -> None:
        self.request_id = request_id
        self.tokens = 0
        """Items produced so far (``stream`` counts them; ``run`` callers may set it)."""
        self.handed_back = False
        self.detail = ""
        self.ack: Ack = ack
        """Who will acknowledge the handoff (see ``Ack``)."""
        self._tracker = tracker
        self._waiting_in: asyncio.Task[Any] | None = None
        """The task that waits on the engine for this request now (a drain may cancel it
        there); None while the request is anywhere else."""
        self._cancelling = 0
        """That task's ``cancelling()`` when it began waiting here (``run``: this wait;
        ``stream``: its first wait)."""
        self._cancelled: asyncio.Task[Any] | None = None
        """The task the drain cancelled, until its CancelledError is seen."""

    @property
    def shutting_down(self) -> bool:
        """True once a drain started (for engines that check between steps themselves)."""
        return self._tracker.shutting_down

    def hand_back(self, detail: str = "", *, ack: Ack | None = None) -> None:
        """Mark the request handed back (for generations ended by the engine's own check);
        ``ack`` overrides who acknowledges it."""
        self.handed_back = True
        self.detail = detail
        if ack is not None:
            self.ack = ack

    async def stream(self, source: AsyncIterable[T]) -> AsyncIterator[T]:
        """Yield ``source``'s items until it ends or a drain hands the request back.

        Every token of every stream passes here, in the engine's busiest process, so each
        step is written out inline: no coroutine per item, one lookup of the task that waits
        (``_task_on``), two attribute writes around the wait, the drain checked once after
        each item is consumed. A task's ``cancelling()`` is read when the task first waits
        here (a consumer may await each step in a task of its own); a drain cancels it only
        while that count is unchanged (``_interrupt``)."""
        tracker = self._tracker
        loop = asyncio.get_running_loop()
        iterator = aiter(source)
        try:
            if self._tracker.shutting_down:
                self.hand_back("drain")
                return
            self._begin_wait(loop)
            waiting_in = self._waiting_in
            try:
                async for item in iterator:
                    self._waiting_in = None
                    self.tokens += 1
                    yield item
                    if tracker.shutting_down:
                        self.hand_back("drain")
                        return
                    task = _task_on(loop)
                    if task is not waiting_in:
                        waiting_in = task
                        self._cancelling = task.cancelling()  # type: ignore[union-attr]
                    self._waiting_in = task
            except asyncio.CancelledError:
                if not self._cancelled_by_drain():
                    raise
            except HandedBack:
                return
        finally:
            self._waiting_in = None
            if self.handed_back:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``; raise HandedBack if a drain interrupts it (or started already)."""
        if self._tracker.shutting_down:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            self.hand_back("drain")
            raise HandedBack(self.request_id, self.tokens)
        return await self._interruptible(awaitable)

    async def _interruptible(self, awaitable: Awaitable[T]) -> T:
        self._begin_wait(asyncio.get_running_loop())
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not self._cancelled_by_drain():
                raise
            raise HandedBack(self.request_id, self.tokens) from None
        finally:
            self._waiting_in = None

    def _begin_wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """The request now waits on the engine, in the task running on ``loop``: a drain may
        cancel that task there (``_interrupt``) until the wait ends."""
        task = _task_on(loop)
        assert task is not None, "tracked requests run inside an asyncio task"
        self._cancelling = task.cancelling()
        self._waiting_in = task

    def _cancelled_by_drain(self) -> bool:
        """After a CancelledError in a wait: True when it was the drain's alone (the request
        is then handed back); False when it is to propagate."""
        task, waiting_in = self._cancelled, self._waiting_in
        self._cancelled = self._waiting_in = None
        if task is None or task is not waiting_in:
            return False
        # Another cancellation (the client went away) wins over ours: propagate it.
        if task.uncancel() > self._cancelling:
            return False
        self.hand_back("drain")
        return True

    def _interrupt(self) -> None:
        """Cancel the task where it waits on the engine, unless a cancellation that is not
        ours is pending there already (it wins: the request is not handed back) or was
        swallowed by the engine's code (the request is then handed back at its next step)."""
        task = self._waiting_in
        if (task is not None and self._cancelled is None
                and task.cancelling() == self._cancelling and task.cancel(HANDOFF_CANCEL_MSG)):
            self._cancelled = task


class TrackScope:
    """``async with client.track(request_id) as request:`` — counts the request in flight.

    A HandedBack raised inside the block is absorbed (check ``request.handed_back`` after it);
    the handoff is reported when the block ends.
    """

    def __init__(self, tracker: Tracker, request_id: str | None, ack: Ack = "router") -> None:
        self._tracker = tracker
        self.request = Request(tracker, request_id, ack)

    async def __aenter__(self) -> Request:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)

    def __enter__(self) -> Request:
        self._tracker.enter(self.request)
        return self.request

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._tracker.leave(self.request)
        return exc_type is not None and issubclass(exc_type, HandedBack)
