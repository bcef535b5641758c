"""``WorkerClient``: the one object an engine holds. It wires the parts and does none of
their work: the link to the coordinator (``_link``), what its events do (``_dispatch``), the
drain state (``_drain``), request tracking (``_tracking``), pre-kill hooks (``_prekill``) and
the scheduling hint (``_scheduling``)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar

import shutdown_wire as wire
from shutdown_wire import Tier
from worker_client import _settings
from worker_client._dispatch import EventDispatch
from worker_client._drain import DrainObserver, DrainState
from worker_client._link import CoordinatorLink
from worker_client._loop import LoopBridge
from worker_client._prekill import PrekillHook, PrekillHooks
from worker_client._registration import Registration
from worker_client._reporter import DEFAULT_WINDOW_S
from worker_client._scheduling import LoopScheduling
from worker_client._tracking import Ack, Tracker, TrackScope
from worker_client.errors import HandedBack

P = ParamSpec("P")
T = TypeVar("T")


class _DrainFact(Generic[T]):
    """A read-only attribute of the client that is its drain state's (``DrainState``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __get__(self, client: WorkerClient, owner: type | None = None) -> T:
        fact: T = getattr(client._drain, self._name)
        return fact


class WorkerClient:
    """Registers this engine process with its coordinator and follows the drain.

    ``shutdown_event`` (asyncio) and ``draining`` (threading) are set the moment a drain
    starts; ``track()`` wraps each request's generation. Without a coordinator URL (or while
    the coordinator is unreachable) the engine serves normally and a local drain still works.

    ``coordinator_url`` and ``token``, left out, come from the variables every manifest
    gives the engine: ``SHUTDOWN_COORDINATOR_URL``, and the token from the file
    ``SHUTDOWN_COORDINATOR_TOKEN_FILE`` names (or ``SHUTDOWN_COORDINATOR_TOKEN``); None for
    either says "none" (``InvalidSetting`` when the token file cannot be read).

    ``event_reader``: where the drain notice is read, ``loop`` (on the engine's loop when
    there is one) or ``thread``. ``latency_slice_us``: how the engine's loop thread is
    scheduled around a doorbell notice, so that the engines of a pod woken by the same write
    set their ``shutdown_event`` without waiting for each other's hand-back work (Linux
    6.12+, ``_scheduling``): None (the default) takes a 100 us slice from the ring until an
    abort and yields the CPU once; N keeps an N us slice for good; 0 leaves the engine's
    scheduling alone. ``handoff_ack``: who
    acknowledges this worker's handoffs by default, ``router`` (one that reads ``/status``)
    or ``engine`` (the engine's own router migrates the stream and never acknowledges, as
    Dynamo's frontend does). ``drain_observer``: given a ``DrainNotice`` at each drain (for
    benchmarks). Each of the last four may also come from the environment (``_settings``).
    """

    def __init__(
        self,
        coordinator_url: str | _settings.FromEnvironment | None = _settings.FROM_ENVIRONMENT,
        *,
        token: str | _settings.FromEnvironment | None = _settings.FROM_ENVIRONMENT,
        role: str = "worker",
        url: str | None = None,
        name: str | None = None,
        pid: int | None = None,
        tiers: Sequence[Tier] = (),
        include_tree: bool = True,
        report_window_s: float = DEFAULT_WINDOW_S,
        event_reader: str | None = None,
        handoff_ack: Ack = "router",
        latency_slice_us: int | None = None,
        drain_observer: DrainObserver | None = None,
    ) -> None:
        self.event_reader = _settings.event_reader(event_reader)
        self.latency_slice_us = _settings.latency_slice(latency_slice_us)
        self._scheduling = LoopScheduling(self.latency_slice_us)
        self.handoff_ack: Ack = handoff_ack
        where = _settings.coordinator_url(coordinator_url)
        self.coordinator_url = where.rstrip("/") if where else None
        token = _settings.token(token)
        self.registration = Registration(
            role=role, url=url, name=name, tiers=tuple(tiers), include_tree=include_tree,
            **({"pid": pid} if pid is not None else {}),
        )
        self.unreported_handoffs = 0
        """Handed-back requests that had no request id yet (they cannot be reported)."""
        self._bridge = LoopBridge()
        self._link = CoordinatorLink(self.coordinator_url, token, self.registration,
                                     self.event_reader, self._bridge, report_window_s)
        self._tracker = Tracker(self._on_inflight, self._on_handoff)
        self._drain = DrainState(self._bridge, self._tracker, self._link.reporter,
                                 self._link.registered, _settings.drain_observer(drain_observer))
        self.shutdown_event: asyncio.Event = self._drain.shutdown_event
        """Set on the engine's loop when a drain starts; cleared if the drain is aborted."""
        self.draining: threading.Event = self._drain.draining
        """The same, for code that is not asyncio."""
        self.registered: threading.Event = self._link.registered
        self._prekill = PrekillHooks(self._bridge, self._link.reporter.prekill_done)
        self._dispatch = EventDispatch(self._bridge, self._drain, self._prekill,
                                       self._scheduling)
        self._link.on_event = self._dispatch.event
        self._link.on_registered = self._dispatch.registered
        self._close_listeners: list[Callable[[], None]] = []

    # -- what the engine reads ----------------------------------------------------------------

    @property
    def worker_id(self) -> str | None:
        return self._link.worker_id

    drain: _DrainFact[dict[str, Any] | None] = _DrainFact("event")
    """The last ``drain`` event (reason, deadlines), None while serving."""
    drain_source: _DrainFact[str | None] = _DrainFact("source")
    """How the drain was learnt (``_drain.SOURCES``)."""
    drain_received_at: _DrainFact[float | None] = _DrainFact("received_at")
    """time.monotonic() when the drain notice was read off the socket."""
    drain_received_in: _DrainFact[str | None] = _DrainFact("received_in")
    """The thread that read it: the loop's own or the reader thread's name."""
    shutdown_set_at: _DrainFact[float | None] = _DrainFact("shutdown_set_at")
    """time.monotonic() when ``shutdown_event`` was set on the loop."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop the client is bound to."""
        return self._bridge.loop

    @property
    def inflight(self) -> int:
        return self._tracker.inflight

    # -- life cycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> WorkerClient:
        """Bind to the engine's loop (the running one by default) and start registering."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._bridge.loop = loop
        if loop is not None:
            self._bridge.call(self._scheduling.bound)
        self._link.start()
        return self

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to a loop that did not exist when ``start`` ran."""
        self._bridge.loop = loop
        loop.call_soon_threadsafe(self._scheduling.bound)

    def close(self, deregister: bool | None = None) -> None:
        """Stop the background threads; deregister unless a drain is on (by default)."""
        if deregister is None:
            deregister = not self.draining.is_set()
        for listener in self._close_listeners:
            listener()
        self._dispatch.close_doorbell()
        self._link.close(deregister)

    @property
    def latency_slice_set(self) -> bool | None:
        """Whether the kernel took the loop thread's slice (None until one was asked for)."""
        return self._scheduling.slice_set

    # -- requests ---------------------------------------------------------------------------

    def track(self, request_id: str | None = None, *, ack: Ack | None = None) -> TrackScope:
        """``async with client.track(rid) as req:`` around one request's generation.

        ``ack="engine"`` reports its handoff as migrated by the engine's own router: counted,
        never pending, so the drain does not wait for a router's acknowledgement."""
        return TrackScope(self._tracker, request_id, ack or self.handoff_ack)

    def tracked(
        self, fn: Callable[P, Awaitable[T]], *, id_arg: str = "request_id"
    ) -> Callable[P, Awaitable[T]]:
        """Decorate a coroutine function: tracked, interrupted by a drain (raises HandedBack).

        The request id is taken from the keyword argument named ``id_arg`` when present.
        """

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            async with self.track(_request_id(kwargs, id_arg)) as req:
                return await req.run(fn(*args, **kwargs))
            raise HandedBack(req.request_id, req.tokens)

        return wrapper

    def tracked_stream(
        self, fn: Callable[P, AsyncIterator[T]], *, id_arg: str = "request_id"
    ) -> Callable[P, AsyncIterator[T]]:
        """Decorate an async generator function: its items stop at a drain, then HandedBack."""

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
            async with self.track(_request_id(kwargs, id_arg)) as req:
                async for item in req.stream(fn(*args, **kwargs)):
                    yield item
            if req.handed_back:
                raise HandedBack(req.request_id, req.tokens)

        return wrapper

    # -- hooks ------------------------------------------------------------------------------

    def add_prekill_hook(self, hook: PrekillHook) -> None:
        """Run ``hook`` when the kill phase is about to start (e.g. stand down a watchdog)."""
        self._prekill.add(hook)

    def on_drain(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the loop, or in the reader thread without one) at a drain."""
        self._drain.listeners.append(listener)

    def on_close(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the engine closes the client (from the closing thread)."""
        self._close_listeners.append(listener)

    # -- the drain --------------------------------------------------------------------------

    def start_local_drain(self, reason: str) -> None:
        """A drain seen first by this process (a SIGTERM): start it here and tell the coordinator.

        Sets the shutdown at once, then asks the coordinator (``POST /drain``, ``wait=false``)
        in the background so the whole pod drains the same way.
        """
        self._drain.begin({"type": wire.EVENT_DRAIN, "reason": reason, "source": "local"},
                          "local")
        if self.coordinator_url:
            threading.Thread(target=self._link.request_drain, args=(reason,),
                             name="worker-client-drain", daemon=True).start()

    def wait_drained(self, timeout: float) -> bool:
        """Block until no request is in flight and every handoff was reported (True)."""
        deadline = time.monotonic() + timeout
        while self._tracker.inflight > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        if not self.registered.is_set():
            return True
        return self._link.reporter.flush(max(0.0, deadline - time.monotonic()))

    # -- what the tracker says --------------------------------------------------------------

    def _on_inflight(self, count: int) -> None:
        if self.draining.is_set():
            self._link.reporter.inflight(count)

    def _on_handoff(self, request_id: str | None, tokens: int, detail: str, ack: Ack) -> None:
        if request_id is None:
            self.unreported_handoffs += 1
            return
        self._link.reporter.handoff(request_id, tokens, detail, ack)


def _request_id(kwargs: dict[str, Any], id_arg: str) -> str | None:
    value = kwargs.get(id_arg)
    return None if value is None else str(value)
