"""A minimal keep-alive HTTP/1.1 JSON POST over a plain socket, for the worker's reports.

The reports leave from a thread of the engine's process while its loop is busy ending
streams. Each time that thread blocks in a system call it gives up the GIL and must wait to
get it back (up to the 5 ms switch interval while the loop's thread runs Python), so the
fewer Python steps and system calls a report takes, the sooner it arrives: one ``sendall``
and usually one ``recv``, against the dozens of steps of a general HTTP client. ``https``
coordinators are not handled here (the caller falls back to httpx).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 5.0


class RawPoster:
    """POSTs JSON bodies to one ``http://`` base URL over one reused connection."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        self._address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._host = parts.netloc
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._sock: socket.socket | None = None

    def post(self, path: str, body: Any) -> tuple[int, bytes]:
        """(status, response body); raises OSError when the coordinator cannot be reached."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\n{self._headers}"
                   f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                   "\r\n").encode("latin-1") + payload
        # A kept-alive connection the server closed meanwhile fails on first use: once more
        # on a fresh one.
        for attempt in (0, 1):
            fresh = self._sock is None
            try:
                return self._exchange(request)
            except OSError:
                self.close()
                if fresh or attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._sock is None:
            sock = socket.create_connection(self._address, timeout=TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        sock = self._sock
        sock.sendall(request)
        raw = bytearray()
        while (end := raw.find(b"\r\n\r\n")) < 0:
            raw += _recv(sock)
        lines = bytes(raw[:end]).split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        del raw[: end + 4]
        if b"content-length" not in headers:
            self.close()  # no framing we handle: read nothing more from this connection
            return status, bytes(raw)
        length = int(headers[b"content-length"])
        while len(raw) < length:
            raw += _recv(sock)
        if headers.get(b"connection") == b"close":
            self.close()
        return status, bytes(raw[:length])


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionResetError("the coordinator closed the connection")
    return data
