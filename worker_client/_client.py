"""The worker's link to its coordinator: registration, drain notice, reports, pre-kill hooks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import httpx

import shutdown_wire as wire
from shutdown_wire import Tier
from worker_client._doorbell import DoorbellWatch
from worker_client._events import EventStream, StreamRefused, WorkerUnknown
from worker_client._raw_http import RawPoster
from worker_client._registration import Registration, register
from worker_client._reporter import DEFAULT_WINDOW_S, Reporter
from worker_client._scheduling import check_slice, set_thread_slice
from worker_client._tracking import Ack, Tracker, TrackScope
from worker_client.errors import CoordinatorRefused, HandedBack

log = logging.getLogger("worker_client")

P = ParamSpec("P")
T = TypeVar("T")

PrekillHook = Callable[[], Any]
"""A plain function or a coroutine function (run on the engine's loop)."""

PREKILL_HOOK_TIMEOUT_S = 5.0
"""How long one pre-kill hook may take before ``prekill_done`` is reported anyway."""

RECONNECT_FIRST_S = 0.02
RECONNECT_MAX_S = 2.0

EVENT_READER_ENV = "WORKER_CLIENT_EVENT_READER"
"""``loop`` (the default: read the event stream on the engine's loop when there is one) or
``thread`` (always a reader thread); the constructor's ``event_reader`` wins over it."""
EVENT_READERS = ("loop", "thread")

LATENCY_SLICE_ENV = "WORKER_CLIENT_LATENCY_SLICE_US"
"""Microseconds; the constructor's ``latency_slice_us`` wins over it (see that argument)."""

TIMINGS_ENV = "WORKER_CLIENT_TIMINGS"
"""A file path: append one JSON line per drain with where the notice came from and when it was
read and acted on (for benchmarks; written a while after the drain, off its critical path)."""
TIMINGS_DELAY_S = 0.5


class WorkerClient:
    """Registers this engine process with its coordinator and follows the drain.

    ``shutdown_event`` (asyncio) and ``draining`` (threading) are set the moment a drain
    starts; ``track()`` wraps each request's generation. Without a coordinator URL (or while
    the coordinator is unreachable) the engine serves normally and a local drain still works.
    """

    def __init__(
        self,
        coordinator_url: str | None,
        *,
        token: str | None = None,
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
    ) -> None:
        reader = event_reader or os.environ.get(EVENT_READER_ENV) or "loop"
        if reader not in EVENT_READERS:
            raise ValueError(f"event_reader must be one of {EVENT_READERS}, not {reader!r}")
        self.event_reader = reader
        if latency_slice_us is None and os.environ.get(LATENCY_SLICE_ENV):
            latency_slice_us = int(os.environ[LATENCY_SLICE_ENV])
        self.latency_slice_us = (None if latency_slice_us is None
                                 else check_slice(latency_slice_us))
        """For engines that share CPUs with other engines of the pod (Linux 6.12+): the
        engine's loop thread asks for this scheduling slice, and yields the CPU once right
        after a doorbell notice, so that the engines woken by the same write set their
        ``shutdown_event`` without waiting for each other's hand-back work (see
        ``_scheduling``). None (the default): the engine's scheduling is left alone."""
        self.latency_slice_set: bool | None = None
        """Whether the kernel took the slice (None until tried)."""
        self.handoff_ack: Ack = handoff_ack
        """Who acknowledges this worker's handoffs by default: ``router`` (one that reads
        ``/status``) or ``engine`` (the engine's own router migrates the stream by itself and
        never acknowledges, as Dynamo's frontend does); ``track(ack=...)`` overrides it."""
        """Where the drain notice is read: on the engine's loop, or in a thread."""
        self.coordinator_url = coordinator_url.rstrip("/") if coordinator_url else None
        self.registration = Registration(
            role=role, url=url, name=name, tiers=tuple(tiers), include_tree=include_tree,
            **({"pid": pid} if pid is not None else {}),
        )
        self.shutdown_event = asyncio.Event()
        """Set on the engine's loop when a drain starts; cleared if the drain is aborted."""
        self.draining = threading.Event()
        """The same, for code that is not asyncio."""
        self.registered = threading.Event()
        self.worker_id: str | None = None
        self.drain: dict[str, Any] | None = None
        """The last ``drain`` event (reason, deadlines), None while serving."""
        self.drain_received_at: float | None = None
        """time.monotonic() when the drain notice was read off the socket."""
        self.drain_source: str | None = None
        """How the drain was learnt: ``push`` (the ``drain`` line on an open stream),
        ``hello`` (a stream opened during the drain), ``register`` or ``local``."""
        self.drain_received_in: str | None = None
        """The thread that read it: the loop's own (``event_reader="loop"``) or the reader
        thread's name."""
        self.shutdown_set_at: float | None = None
        """time.monotonic() when ``shutdown_event`` was set on the loop."""
        self.unreported_handoffs = 0
        """Handed-back requests that had no request id yet (they cannot be reported)."""
        self._drain_received_wall = 0.0
        self._timing: dict[str, Any] | None = None
        """This drain's record for ``TIMINGS_ENV``, until it is written."""
        self._headers = wire.bearer_header(token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = threading.Event()
        self._stream: EventStream | None = None
        self._doorbell: DoorbellWatch | None = None
        """The coordinator's doorbell, watched on the loop (loop reader only)."""
        self._thread: threading.Thread | None = None
        self._prekill_hooks: list[PrekillHook] = []
        self._drain_listeners: list[Callable[[], None]] = []
        self._close_listeners: list[Callable[[], None]] = []
        self._http = httpx.Client(
            base_url=self.coordinator_url or "http://invalid", headers=self._headers,
            timeout=httpx.Timeout(5.0, connect=1.0),
        )
        self._poster = (RawPoster(self.coordinator_url, self._headers)
                        if self.coordinator_url and self.coordinator_url.startswith("http://")
                        else None)
        """Reports go over a plain socket (see ``_raw_http``); httpx for ``https``."""
        self._tracker = Tracker(self._on_inflight, self._on_handoff)
        self._reporter = Reporter(self._post_report, window_s=report_window_s)

    # -- life cycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> WorkerClient:
        """Bind to the engine's loop (the running one by default) and start registering."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        if self.latency_slice_us is not None and loop is not None:
            if _running_loop() is loop:
                self._set_slice()
            else:
                loop.call_soon_threadsafe(self._set_slice)
        if self.coordinator_url and self._thread is None:
            self._thread = threading.Thread(
                target=self._follow_coordinator, name="worker-client-events", daemon=True
            )
            self._thread.start()
        return self

    def _set_slice(self) -> None:
        """On the loop's thread: the slice is per thread."""
        assert self.latency_slice_us is not None
        self.latency_slice_set = set_thread_slice(self.latency_slice_us)

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to a loop that did not exist when ``start`` ran."""
        self._loop = loop
        if self.latency_slice_us is not None and self.latency_slice_set is None:
            loop.call_soon_threadsafe(self._set_slice)

    def close(self, deregister: bool | None = None) -> None:
        """Stop the background threads; deregister unless a drain is on (by default)."""
        if deregister is None:
            deregister = not self.draining.is_set()
        for listener in self._close_listeners:
            listener()
        if self.registered.is_set():
            self._reporter.flush(timeout=1.0)
        self._closed.set()
        if self._stream is not None:
            self._stream.close()
        self._close_doorbell()
        if deregister and self.worker_id is not None:
            with contextlib.suppress(httpx.HTTPError):
                self._http.delete(f"/workers/{self.worker_id}")
        self._reporter.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._http.close()
        if self._poster is not None:
            self._poster.close()

    # -- requests ---------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._tracker.inflight

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
        self._prekill_hooks.append(hook)

    def on_drain(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the loop, or in the reader thread without one) at a drain."""
        self._drain_listeners.append(listener)

    def on_close(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the engine closes the client (from the closing thread)."""
        self._close_listeners.append(listener)

    # -- the drain --------------------------------------------------------------------------

    def start_local_drain(self, reason: str) -> None:
        """A drain seen first by this process (a SIGTERM): start it here and tell the coordinator.

        Sets the shutdown at once, then asks the coordinator (``POST /drain``, ``wait=false``)
        in the background so the whole pod drains the same way.
        """
        self._begin_drain({"type": wire.EVENT_DRAIN, "reason": reason, "source": "local"},
                          "local")
        if self.coordinator_url:
            threading.Thread(
                target=self._request_drain, args=(reason,), name="worker-client-drain", daemon=True
            ).start()

    def wait_drained(self, timeout: float) -> bool:
        """Block until no request is in flight and every handoff was reported (True)."""
        deadline = time.monotonic() + timeout
        while self._tracker.inflight > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        if not self.registered.is_set():
            return True
        return self._reporter.flush(max(0.0, deadline - time.monotonic()))

    def _request_drain(self, reason: str) -> None:
        try:
            self._http.post("/drain", json={"wait": False, "reason": reason})
        except httpx.HTTPError as exc:
            log.warning("could not ask the coordinator to drain: %s", exc)

    def _begin_drain(self, event: dict[str, Any], source: str) -> None:
        if self.draining.is_set():
            if self.drain_source == "doorbell" and source in ("push", "hello"):
                self.drain = event  # the doorbell said when; the line says until when
                if self._timing is not None and self._timing["started_at"] is None:
                    self._timing["started_at"] = event.get("started_at")
            return
        self.drain = event
        self.drain_received_at = time.monotonic()
        self.drain_source = source
        self._drain_received_wall = time.time()
        self.drain_received_in = threading.current_thread().name
        self._tracker.shutting_down = True
        self.draining.set()
        loop = self._loop
        if loop is not None and _running_loop() is loop:
            self._shutdown_on_loop()  # read on the loop: set it in this very iteration
        elif loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._shutdown_on_loop)
            except RuntimeError:  # the loop closed in between
                self._shutdown_on_loop()
        else:
            self._shutdown_on_loop()
        self._reporter.inflight(self._tracker.inflight)

    def _shutdown_on_loop(self) -> None:
        if not self._tracker.shutting_down:  # aborted before the loop got to it
            return
        self.shutdown_set_at = time.monotonic()
        self.shutdown_event.set()
        set_at = time.time()
        if self.registered.is_set():
            self._reporter.notified(set_at)
        timings = os.environ.get(TIMINGS_ENV)
        if timings and self._loop is not None and _running_loop() is self._loop:
            record = {"pid": os.getpid(), "source": self.drain_source,
                      "started_at": (self.drain or {}).get("started_at"),
                      "received_at": self._drain_received_wall, "set_at": set_at,
                      "read_in": self.drain_received_in}
            self._timing = record  # after a doorbell, the drain line tells the start
            self._loop.call_later(TIMINGS_DELAY_S, _append_line, timings, record)
        self._tracker.interrupt_all()
        for listener in self._drain_listeners:
            listener()

    def _abort_drain(self) -> None:
        if not self.draining.is_set():
            return
        self.drain = None
        self._timing = None
        self._tracker.resume()
        self.draining.clear()
        if self._loop is not None and _running_loop() is self._loop:
            self.shutdown_event.clear()
            if self._doorbell is not None:
                self._doorbell.rearm()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.shutdown_event.clear)
        else:
            self.shutdown_event.clear()

    # -- background: registration and the event stream -------------------------------------

    def _follow_coordinator(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                if self.worker_id is None:
                    self._register()
                assert self.worker_id is not None
                self._stream = EventStream(
                    f"{self.coordinator_url}/workers/{self.worker_id}/events", self._headers
                )
                loop = self._loop
                if self.event_reader == "loop" and loop is not None and not loop.is_closed():
                    self._stream.run_on_loop(loop, self._on_event)
                else:
                    self._stream.run(self._on_event)
            except WorkerUnknown:
                log.info("coordinator forgot worker %s; registering again", self.worker_id)
                self._forget_registration()
                continue
            except CoordinatorRefused as exc:
                log.error("%s; the engine keeps serving without a coordinator", exc)
                return
            except StreamRefused as exc:
                if exc.status in (401, 403):
                    log.error("%s; the engine keeps serving without a coordinator", exc)
                    return
            except RuntimeError:
                return  # closed while registering
            except Exception as exc:  # the stream broke: open it again
                log.debug("event stream ended: %r", exc)
            if self._closed.is_set():
                return
            if self._stream_was_healthy:
                failures = 0
            failures += 1
            self._stream_was_healthy = False
            delay = min(RECONNECT_MAX_S, RECONNECT_FIRST_S * 2 ** (failures - 1))
            self._closed.wait(delay * (0.5 + random.random()))

    _stream_was_healthy = False

    def _register(self) -> None:
        data = register(
            self._http, self.registration, stop_when=self._closed.is_set, sleep=self._closed.wait
        )
        self.worker_id = str(data["id"])
        self.registered.set()
        self._reporter.enable(True)
        log.info("registered with %s as worker %s", self.coordinator_url, self.worker_id)
        if data.get("phase") in wire.DRAIN_PHASES:
            self._begin_drain({"type": wire.EVENT_DRAIN, "reason": "joined a running drain"},
                              "register")

    def _forget_registration(self) -> None:
        self._reporter.enable(False)
        self.registered.clear()
        self.worker_id = None

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == wire.EVENT_DRAIN:
            self._begin_drain(event, "push")
        elif kind == wire.EVENT_HELLO:
            self._stream_was_healthy = True
            phase = event.get("phase")
            self._watch_doorbell(event.get("doorbell"))
            if phase in wire.DRAIN_PHASES:
                self._begin_drain({**event, "type": wire.EVENT_DRAIN}, "hello")
            elif phase == wire.PHASE_SERVING and self.drain and self.drain.get("source") != "local":
                self._abort_drain()
        elif kind == wire.EVENT_ABORT:
            self._abort_drain()
        elif kind == wire.EVENT_TERMINATE:
            threading.Thread(target=self._run_prekill_hooks, name="worker-client-prekill",
                             daemon=True).start()

    def _watch_doorbell(self, info: Any) -> None:
        """On the loop (loop reader): watch the pipe the ``hello`` named. A ring heard while
        already draining is a no-op, so this does not depend on the phase."""
        loop = self._loop
        if loop is None or _running_loop() is not loop:
            return  # the thread reader: the stream alone
        if self._doorbell is None:
            self._doorbell = DoorbellWatch(loop, self._doorbell_rang)
        self._doorbell.arm(info)

    def _doorbell_rang(self) -> None:
        self._begin_drain({"type": wire.EVENT_DRAIN, "reason": "doorbell"}, "doorbell")
        if self.latency_slice_us is not None:
            # Every engine of the pod woke at this same write: let those not yet run set
            # their events before this one starts handing its requests back.
            os.sched_yield()

    def _close_doorbell(self) -> None:
        bell, loop = self._doorbell, self._loop
        if bell is None:
            return
        if loop is None or loop.is_closed() or not loop.is_running() or _running_loop() is loop:
            bell.close()
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(bell.close)

    def _run_prekill_hooks(self) -> None:
        for hook in self._prekill_hooks:
            try:
                if inspect.iscoroutinefunction(hook):
                    if self._loop is None or self._loop.is_closed():
                        asyncio.run(hook())
                    else:
                        asyncio.run_coroutine_threadsafe(hook(), self._loop).result(
                            PREKILL_HOOK_TIMEOUT_S
                        )
                else:
                    hook()
            except Exception:
                log.exception("pre-kill hook %r failed", hook)
        self._reporter.prekill_done()

    # -- reports ----------------------------------------------------------------------------

    def _on_inflight(self, count: int) -> None:
        if self.draining.is_set():
            self._reporter.inflight(count)

    def _on_handoff(self, request_id: str | None, tokens: int, detail: str, ack: Ack) -> None:
        if request_id is None:
            self.unreported_handoffs += 1
            return
        self._reporter.handoff(request_id, tokens, detail, ack)

    def _post_report(self, report: dict[str, Any]) -> None:
        worker_id = self.worker_id
        if worker_id is None:
            raise RuntimeError("not registered")
        path = f"/workers/{worker_id}/report"
        if self._poster is not None:
            status, _ = self._poster.post(path, report)
        else:
            status = self._http.post(path, json=report).status_code
        if status == 404 and self._stream is not None:
            self._stream.close()  # the events thread registers again
        if status >= 400:
            raise CoordinatorRefused(status, "report refused")


def _append_line(path: str, record: dict[str, Any]) -> None:
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _request_id(kwargs: dict[str, Any], id_arg: str) -> str | None:
    value = kwargs.get(id_arg)
    return None if value is None else str(value)
