"""Hold the coordinator's NDJSON event stream open and hand each event to a callback.

The drain notice must reach the engine within a few milliseconds, so the reading path is kept
as short as it can be: a plain socket (``TCP_NODELAY``), the HTTP/1.1 response head parsed
once, then each chunk appended to a buffer and split on newlines. No HTTP library sits between
``recv`` and the callback. Two readers share that parser:

- on the engine's asyncio loop (``run_on_loop``): the socket is registered with
  ``loop.add_reader``, so the loop reads the drain line and runs the callback in the very
  iteration in which the bytes arrive. Nothing crosses threads on the way to
  ``shutdown_event``: no wait for the GIL (up to the 5 ms switch interval while the engine's
  thread runs Python), no ``call_soon_threadsafe`` wake-up.
- in a thread of its own (``run``), for engines without a loop: it does not depend on any
  loop being free.

Connecting and sending the request happen in the caller's thread either way. ``https``
coordinators go through httpx in a thread (slower, rare: the coordinator is a sidecar on
loopback).
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

import httpx

Event = dict[str, Any]

log = logging.getLogger("worker_client")

READ_TIMEOUT_S = 45.0
"""The coordinator pings every 15 s; three missed pings mean the connection is dead."""

CONNECT_TIMEOUT_S = 2.0

LOOP_CHECK_S = 1.0
"""How often the thread that owns a loop-read stream checks the loop is still there and
the stream not silent for too long (only the failure paths depend on it)."""


class StreamEnded(Exception):
    """The coordinator closed the stream (restart, shutdown): open it again."""


class WorkerUnknown(Exception):
    """404: the coordinator does not know this worker (it restarted without state): register."""


class StreamRefused(Exception):
    """Any other non-200 answer to the stream request."""

    def __init__(self, status: int) -> None:
        super().__init__(f"event stream answered {status}")
        self.status = status


class StreamParser:
    """Incremental parser of the stream's bytes: the response head, then NDJSON lines in a
    chunked (or plain) body. ``feed`` returns the complete events so far and raises
    WorkerUnknown / StreamRefused on the head, StreamEnded on the last chunk."""

    def __init__(self) -> None:
        self._raw = bytearray()
        self._body = bytearray()
        self._head_done = False
        self._chunked = False

    def feed(self, data: bytes) -> list[Event]:
        self._raw += data
        if not self._head_done:
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return []
            status, self._chunked = _parse_head(bytes(self._raw[:end]))
            del self._raw[: end + 4]
            if status == 404:
                raise WorkerUnknown()
            if status != 200:
                raise StreamRefused(status)
            self._head_done = True
        if self._chunked:
            _dechunk(self._raw, self._body)
        else:
            self._body += self._raw
            self._raw.clear()
        events: list[Event] = []
        body = self._body
        while (nl := body.find(b"\n")) >= 0:
            line = bytes(body[:nl])
            del body[: nl + 1]
            if line.strip():
                events.append(json.loads(line))
        return events


class EventStream:
    """One open event stream; ``run``/``run_on_loop`` block until it ends, ``close`` ends it
    from anywhere."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        self._url = url
        self._headers = dict(headers)
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
        WorkerUnknown, OSError..."""
        if urlsplit(self._url).scheme == "https":
            self._run_httpx(on_event)
            return
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
        if urlsplit(self._url).scheme == "https":
            self._run_httpx(on_event)
            return
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
        parts = urlsplit(self._url)
        sock = socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 80), timeout=CONNECT_TIMEOUT_S
        )
        self._sock = sock
        try:
            if self._closed.is_set():
                raise StreamEnded("closed")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(READ_TIMEOUT_S)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            head = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}"]
            head += ["Accept: application/x-ndjson"]
            head += [f"{k}: {v}" for k, v in self._headers.items()]
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        except BaseException:
            self._sock = None
            sock.close()
            raise
        return sock

    def _run_httpx(self, on_event: Callable[[Event], None]) -> None:
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
        with httpx.stream("GET", self._url, headers=self._headers, timeout=timeout) as resp:
            if resp.status_code == 404:
                raise WorkerUnknown()
            if resp.status_code != 200:
                raise StreamRefused(resp.status_code)
            for line in resp.iter_lines():
                if self._closed.is_set():
                    break
                if line.strip():
                    on_event(json.loads(line))
        raise StreamEnded("stream closed")


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
            data = self._sock.recv(65536)
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
                reason = StreamEnded("closed") if closed.is_set() else TimeoutError(
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
    data = sock.recv(65536)
    if not data:
        raise StreamEnded("connection closed")
    return data


def _parse_head(head: bytes) -> tuple[int, bool]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    chunked = any(
        line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
        for line in lines[1:]
    )
    return status, chunked


def _dechunk(raw: bytearray, body: bytearray) -> None:
    """Move every complete chunk from ``raw`` to ``body``; keep a partial one in ``raw``."""
    while (eol := raw.find(b"\r\n")) >= 0:
        size = int(bytes(raw[:eol]).split(b";", 1)[0], 16)
        if size == 0:
            raise StreamEnded("last chunk")
        if len(raw) < eol + 2 + size + 2:
            return
        body += raw[eol + 2 : eol + 2 + size]
        del raw[: eol + 2 + size + 2]
