"""The link to the coordinator: registration, the event stream and the reports.

One thread (``worker-client-events``) follows the coordinator for as long as the client is
open:

1. register (``_registration``: retried while the coordinator is down);
2. open the event stream and read it, on the engine's loop or in this thread;
3. when the stream ends, open it again (``_retry.wait_reconnect``: 20 ms, doubling up to
   2 s, from the first after a stream that said hello); a 404 means the coordinator
   forgot this worker: register again at once;
4. stop when the client closes, or for good when the coordinator refuses the registration
   or the token (the engine keeps serving without a coordinator).

Reports leave from the reporter's thread over a connection of their own; other calls
(deregistration, a drain request) use a connection each.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from tenacity import Retrying, retry_if_exception

import shutdown_wire as wire
from worker_client._events import EventStream
from worker_client._http import Connection, call_once
from worker_client._loop import LoopBridge
from worker_client._registration import Registration, register
from worker_client._reporter import Reporter
from worker_client._retry import stop_when_true, stream_retryable, wait_reconnect
from worker_client.errors import (
    ClientClosed,
    CoordinatorError,
    CoordinatorRefused,
    NotRegistered,
    WorkerUnknown,
)

log = logging.getLogger("worker_client")

EventHandler = Callable[[dict[str, Any]], None]


class CoordinatorLink:
    def __init__(self, url: str | None, token: str | None, registration: Registration,
                 event_reader: str, bridge: LoopBridge, report_window_s: float) -> None:
        self.url = url
        self.registration = registration
        self.registered = threading.Event()
        self.worker_id: str | None = None
        self.on_event: EventHandler = lambda event: None
        self.on_registered: EventHandler = lambda answer: None
        self._headers = wire.bearer_header(token)
        self._event_reader = event_reader
        self._bridge = bridge
        self._closed = threading.Event()
        self._stream: EventStream | None = None
        self._thread: threading.Thread | None = None
        self._calls = Connection(url, self._headers) if url else None
        self._reports = Connection(url, self._headers) if url else None
        self.reporter = Reporter(self._post_report, window_s=report_window_s)

    def start(self) -> None:
        if self.url and self._thread is None:
            self._thread = threading.Thread(target=self._follow, name="worker-client-events",
                                            daemon=True)
            self._thread.start()

    def close(self, deregister: bool) -> None:
        """Send what is collected, stop following, deregister (if asked), let go."""
        if self.registered.is_set():
            self.reporter.flush(timeout=1.0)
        self._closed.set()
        if self._stream is not None:
            self._stream.close()
        if deregister and self.worker_id is not None and self.url:
            try:
                call_once(self.url, self._headers, "DELETE", f"/workers/{self.worker_id}")
            except CoordinatorError as exc:
                log.info("could not deregister: %s", exc)
        self.reporter.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for connection in (self._calls, self._reports):
            if connection is not None:
                connection.close()

    def request_drain(self, reason: str) -> None:
        """``POST /drain`` without waiting for it (from a thread of its own)."""
        if not self.url:
            return
        try:
            call_once(self.url, self._headers, "POST", "/drain", {"wait": False, "reason": reason})
        except CoordinatorError as exc:
            log.warning("could not ask the coordinator to drain: %s", exc)

    # -- the events thread ------------------------------------------------------------------

    def _follow(self) -> None:
        wait = wait_reconnect()
        retrying = Retrying(retry=retry_if_exception(stream_retryable), wait=wait,
                            stop=stop_when_true(self._closed.is_set), sleep=self._pause,
                            reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    number = attempt.retry_state.attempt_number
                    self._follow_once(functools.partial(wait.healthy, number))
        except Exception as exc:
            if self._closed.is_set():  # whatever ended the last attempt before the close
                log.debug("stopped following the coordinator: %r", exc)
            else:  # the token refused on the stream
                _give_up(exc)

    def _pause(self, seconds: float) -> None:
        """tenacity's sleep: closing the client cuts it short."""
        self._closed.wait(seconds)

    def _follow_once(self, healthy: Callable[[], None]) -> None:
        """Register if needed, then read the stream until it ends (it raises why). Returns
        only when the coordinator refused the registration: nothing more to try."""
        if self._closed.is_set():
            raise ClientClosed("worker client closed")
        if self.worker_id is None:
            try:
                self._register()
            except CoordinatorRefused as exc:
                _give_up(exc)
                return

        def on_event(event: dict[str, Any]) -> None:
            if event.get("type") == wire.EVENT_HELLO:
                healthy()
            self.on_event(event)

        self._stream = EventStream(f"{self.url}/workers/{self.worker_id}/events", self._headers)
        loop = self._bridge.loop
        try:
            if self._event_reader == "loop" and loop is not None and not loop.is_closed():
                self._stream.run_on_loop(loop, on_event)
            else:
                self._stream.run(on_event)
        except WorkerUnknown:
            log.info("coordinator forgot worker %s; registering again", self.worker_id)
            self.reporter.enable(False)
            self.registered.clear()
            self.worker_id = None
            raise

    def _register(self) -> None:
        assert self._calls is not None
        answer = register(self._calls, self.registration, stop_when=self._closed.is_set,
                          sleep=self._closed.wait)
        self.worker_id = str(answer["id"])
        self.registered.set()
        self.reporter.enable(True)
        log.info("registered with %s as worker %s", self.url, self.worker_id)
        self.on_registered(answer)

    # -- the reporter's thread ----------------------------------------------------------------

    def _post_report(self, report: dict[str, Any]) -> None:
        worker_id = self.worker_id
        if worker_id is None or self._reports is None:
            raise NotRegistered("no registration to report under")
        answer = self._reports.request("POST", f"/workers/{worker_id}/report", report)
        if answer.status == 404 and self._stream is not None:
            self._stream.close()  # the events thread registers again
        if answer.status >= 400:
            raise CoordinatorRefused(answer.status, "report refused")


def _give_up(exc: BaseException) -> None:
    log.error("%s; the engine keeps serving without a coordinator", exc)
