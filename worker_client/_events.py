"""Hold the coordinator's NDJSON event stream open and hand each event to a callback.

The drain notice must reach the engine within a few milliseconds, so the reading path is kept
as short as it can be: a plain blocking socket (``TCP_NODELAY``) in a thread of its own, the
HTTP/1.1 response head parsed once, then each chunk appended to a buffer and split on newlines.
No HTTP library sits between ``recv`` and the callback, and the thread does not depend on the
engine's event loop being free. ``https`` coordinators go through httpx instead (slower, rare:
the coordinator is a sidecar on loopback).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

Event = dict[str, Any]

READ_TIMEOUT_S = 45.0
"""The coordinator pings every 15 s; three missed pings mean the connection is dead."""

CONNECT_TIMEOUT_S = 2.0


class StreamEnded(Exception):
    """The coordinator closed the stream (restart, shutdown): open it again."""


class WorkerUnknown(Exception):
    """404: the coordinator does not know this worker (it restarted without state): register."""


class StreamRefused(Exception):
    """Any other non-200 answer to the stream request."""

    def __init__(self, status: int) -> None:
        super().__init__(f"event stream answered {status}")
        self.status = status


class EventStream:
    """One open event stream; ``run`` blocks until it ends, ``close`` ends it from anywhere."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        self._url = url
        self._headers = dict(headers)
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self, on_event: Callable[[Event], None]) -> None:
        """Read events until the stream ends; raises StreamEnded, WorkerUnknown, OSError..."""
        parts = urlsplit(self._url)
        if parts.scheme == "https":
            self._run_httpx(on_event)
            return
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
            self._read(sock, on_event)
        finally:
            self._sock = None
            sock.close()

    def _read(self, sock: socket.socket, on_event: Callable[[Event], None]) -> None:
        raw = bytearray()
        while (end := raw.find(b"\r\n\r\n")) < 0:
            raw += _recv(sock)
        status, chunked = _parse_head(bytes(raw[:end]))
        del raw[: end + 4]
        if status == 404:
            raise WorkerUnknown()
        if status != 200:
            raise StreamRefused(status)
        body = bytearray()
        while True:
            if chunked:
                _dechunk(raw, body)
            else:
                body += raw
                raw.clear()
            while (nl := body.find(b"\n")) >= 0:
                line = bytes(body[:nl])
                del body[: nl + 1]
                if line.strip():
                    on_event(json.loads(line))
            raw += _recv(sock)

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
