"""Hold the coordinator's NDJSON event stream open and hand each event to a callback.

The drain notice must reach the engine within a few milliseconds, so the reading path is kept
as short as it can be: the transport's socket (``_http``: ``TCP_NODELAY``, the response read
incrementally), each chunk split on newlines. Two readers share that parser:

- on the engine's asyncio loop (``run_on_loop``): the socket is registered with
  ``loop.add_reader``, so the loop reads the drain line and runs the callback in the very
  iteration in which the bytes arrive. Nothing crosses threads on the way to
  ``shutdown_event``: no wait for the GIL (up to the 5 ms switch interval while the engine's
  thread runs Python), no ``call_soon_threadsafe`` wake-up.
- in a thread of its own (``run``), for engines without a loop: it does not depend on any
  loop being free.

Connecting and sending the request happen in the caller's thread either way. ``https``
coordinators are read in the caller's thread (``run``) even when a loop is given: a TLS
socket may hold decrypted bytes that its readiness does not announce (the coordinator is a
sidecar on loopback, so this is rare).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from worker_client._http import RECV_BYTES, Origin, ResponseReader, connect, request_head
from worker_client._http import translated as _translated
from worker_client.errors import CoordinatorRefused, StreamEnded, WorkerUnknown

Event = dict[str, Any]

log = logging.getLogger("worker_client")

READ_TIMEOUT_S = 45.0
"""The coordinator pings every 15 s; three missed pings mean the connection is dead."""

CONNECT_TIMEOUT_S = 2.0

LOOP_CHECK_S = 1.0
"""How often the thread that owns a loop-read stream checks the loop is still there and
the stream not silent for too long (only the failure paths depend on it)."""


class StreamParser:
    """Incremental parser of the stream's bytes: the response head, then NDJSON lines.
    ``feed`` returns the complete events so far and raises WorkerUnknown or
    CoordinatorRefused on the head, StreamEnded at the body's end, ValueError on garbage."""

    def __init__(self) -> None:
        self._reader = ResponseReader()
        self._body = bytearray()

    def feed(self, data: bytes) -> list[Event]:
        self._body += self._reader.feed(data)
        status = self._reader.status
        if status == 404:
            raise WorkerUnknown("the coordinator does not know this worker's stream")
        if status is not None and status != 200:
            raise CoordinatorRefused(status, "event stream refused")
        events: list[Event] = []
        body = self._body
        while (nl := body.find(b"\n")) >= 0:
            line = bytes(body[:nl])
            del body[: nl + 1]
            if line.strip():
                events.append(json.loads(line))
        if self._reader.complete:
            raise StreamEnded("last chunk")
        return events


class EventStream:
    """One open event stream; ``run``/``run_on_loop`` block until it ends (raising why),
    ``close`` ends it from anywhere."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        self._origin = Origin.of(url)
        parts = urlsplit(url)
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = {**headers, "Accept": "application/x-ndjson"}
        self._sock: socket.socket | None = None
        self._reader: _LoopReader | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        reader = self._reader
        if reader is not None and reader.on_its_loop():
            # Closed from the loop itself (an engine shutting down): the loop may block
            # right after this (joining our thread), so stop reading here, not next iteration.
            reader.finish(StreamEnded("closed"))
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self, on_event: Callable[[Event], None]) -> None:
        """Read events in this thread until the stream ends; raises StreamEnded,
        WorkerUnknown, CoordinatorRefused, CoordinatorUnreachable, ProtocolError."""
        with _translated("event stream"):
            sock = self._open()
            try:
                parser = StreamParser()
                while True:
                    for event in parser.feed(_recv(sock)):
                        on_event(event)
            finally:
                self._sock = None
                sock.close()

    def run_on_loop(self, loop: asyncio.AbstractEventLoop,
                    on_event: Callable[[Event], None]) -> None:
        """Connect from this thread, then let ``loop`` read the stream and call ``on_event``
        on the loop; block this thread until the stream ends (raises like ``run``)."""
        if self._origin.tls:
            self.run(on_event)
            return
        with _translated("event stream"):
            sock = self._open()
            sock.setblocking(False)
            reader = _LoopReader(loop, sock, on_event)
            self._reader = reader
            try:
                loop.call_soon_threadsafe(reader.attach)
                reader.wait(self._closed)
            finally:
                self._reader = None
                self._sock = None
                sock.close()

    def _open(self) -> socket.socket:
        sock = connect(self._origin, CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        self._sock = sock
        try:
            if self._closed.is_set():
                raise StreamEnded("closed")
            sock.sendall(request_head("GET", self._target, self._origin, self._headers))
        except BaseException:
            self._sock = None
            sock.close()
            raise
        return sock


class _LoopReader:
    """The loop's side of ``run_on_loop``: reads on readiness, parses, calls back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 on_event: Callable[[Event], None]) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._on_event = on_event
        self._parser = StreamParser()
        self._attached = False
        self._ended = threading.Event()
        self._error: BaseException = StreamEnded("connection closed")
        self._last_data = time.monotonic()

    def on_its_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def attach(self) -> None:
        """On the loop: start reading."""
        if self._ended.is_set():
            return
        self._loop.add_reader(self._fd, self._readable)
        self._attached = True

    def _readable(self) -> None:
        try:
            data = self._sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.finish(exc)
            return
        if not data:
            self.finish(StreamEnded("connection closed"))
            return
        self._last_data = time.monotonic()
        try:
            events = self._parser.feed(data)
        except Exception as exc:
            self.finish(exc)
            return
        for event in events:
            try:
                self._on_event(event)
            except Exception:
                log.exception("handling event %r failed", event.get("type"))

    def finish(self, error: BaseException) -> None:
        """On the loop: stop reading and let the waiting thread go on."""
        if self._attached:
            self._attached = False
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
        self._error = error
        self._ended.set()

    def wait(self, closed: threading.Event) -> None:
        """In the caller's thread: until the stream ends; raises why it ended."""
        while not self._ended.wait(LOOP_CHECK_S):
            if self._loop.is_closed():
                self._error = StreamEnded("the engine's loop closed")
                break
            if time.monotonic() - self._last_data > READ_TIMEOUT_S or closed.is_set():
                reason = StreamEnded("closed" if closed.is_set() else
                                     "no ping from the coordinator")
                if not self._loop.is_running():
                    self.finish(reason)  # no loop thread to race with
                    break
                try:
                    self._loop.call_soon_threadsafe(self.finish, reason)
                except RuntimeError:  # the loop closed in between
                    break
        raise self._error


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(RECV_BYTES)
    if not data:
        raise StreamEnded("connection closed")
    return data
