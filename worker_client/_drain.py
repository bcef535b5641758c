"""This process's view of the drain: whether one is on, how it was learnt, and when.

A drain is learnt from one of five sources (``DrainNotice.source``); the first one starts
it here, the later ones only add what they know (the drain line's deadlines after the
doorbell). Starting it, in order:

1. record when and where (which thread) the notice was read;
2. mark the tracker shutting down, so a request that enters now is handed back at once;
3. on the engine's loop (at once when the notice was read there): set ``shutdown_event``,
   tell the reporter when (``notified_at``), hand the notice to the observer, interrupt
   every tracked generation, call the drain listeners;
4. report the in-flight count.

An abort undoes 2 and 3 (the doorbell is watched again), unless the drain was started here
by a signal (``local``): only the coordinator's ``hello`` in ``serving`` ends that.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from worker_client._loop import LoopBridge
from worker_client._tracking import Tracker

SOURCES = ("doorbell", "push", "hello", "register", "local")
"""How a drain is learnt: the coordinator's doorbell pipe, the ``drain`` line on an open
stream, a stream opened during the drain, a registration during it, a signal to this
process."""


@dataclass
class DrainNotice:
    """When and how this process learnt of one drain (what a drain observer is given).

    Given the moment ``shutdown_event`` is set, on the engine's loop (in the thread that read
    the notice when there is no loop); ``started_at`` is filled in later, on the same object,
    when the doorbell came before the drain line."""

    pid: int
    source: str
    """One of ``SOURCES``."""
    started_at: float | None
    """The coordinator's drain start (epoch s); None until a drain line or hello says."""
    received_at: float
    """Epoch s when the notice was read."""
    set_at: float
    """Epoch s when ``shutdown_event`` was set."""
    read_in: str
    """The thread that read it: the loop's own, or the reader thread's name."""


DrainObserver = Callable[[DrainNotice], None]
"""Called on the loop at each drain; it must return at once (defer any I/O): every engine
of the pod is setting its ``shutdown_event`` at the same moment."""


class Reports(Protocol):
    def inflight(self, count: int) -> None: ...
    def notified(self, at: float) -> None: ...


class DrainState:
    def __init__(self, bridge: LoopBridge, tracker: Tracker, reports: Reports,
                 registered: threading.Event, observer: DrainObserver | None) -> None:
        self.shutdown_event = asyncio.Event()
        self.draining = threading.Event()
        self.event: dict[str, Any] | None = None
        self.source: str | None = None
        self.received_at: float | None = None
        self.received_in: str | None = None
        self.shutdown_set_at: float | None = None
        self.listeners: list[Callable[[], None]] = []
        self.on_abort_on_loop: Callable[[], None] = lambda: None
        self._bridge = bridge
        self._tracker = tracker
        self._reports = reports
        self._registered = registered
        self._observer = observer
        self._received_wall = 0.0
        self._notice: DrainNotice | None = None

    def begin(self, event: dict[str, Any], source: str) -> None:
        if self.draining.is_set():
            if self.source == "doorbell" and source in ("push", "hello"):
                self.event = event  # the doorbell said when; the line says until when
                if self._notice is not None and self._notice.started_at is None:
                    self._notice.started_at = event.get("started_at")
            return
        # 1. When and where.
        self.event = event
        self.received_at = time.monotonic()
        self.source = source
        self._received_wall = time.time()
        self.received_in = threading.current_thread().name
        # 2. New requests are handed back from now on.
        self._tracker.shutting_down = True
        self.draining.set()
        # 3. On the loop.
        self._bridge.call(self._set_on_loop)
        # 4. The in-flight count.
        self._reports.inflight(self._tracker.inflight)

    def _set_on_loop(self) -> None:
        if not self._tracker.shutting_down:  # aborted before the loop got to it
            return
        self.shutdown_set_at = time.monotonic()
        self.shutdown_event.set()
        set_at = time.time()
        if self._registered.is_set():
            self._reports.notified(set_at)
        if self._observer is not None:
            self._notice = DrainNotice(
                pid=os.getpid(), source=self.source or "", set_at=set_at,
                started_at=(self.event or {}).get("started_at"),
                received_at=self._received_wall, read_in=self.received_in or "")
            self._observer(self._notice)
        self._tracker.interrupt_all()
        for listener in self.listeners:
            listener()

    def abort(self) -> None:
        if not self.draining.is_set():
            return
        self.event = None
        self._notice = None
        self._tracker.resume()
        self.draining.clear()
        self._bridge.call(self._clear_on_loop)

    def _clear_on_loop(self) -> None:
        self.shutdown_event.clear()
        if self._bridge.here():
            self.on_abort_on_loop()
