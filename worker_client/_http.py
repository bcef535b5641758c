"""The client's one HTTP transport: HTTP/1.1 over a plain socket (TLS for ``https``).

Standard library only, and as few Python steps and system calls between the socket and the
caller as it can be: the drain notice is read on the engine's loop straight off the socket
(``_events``), and reports leave from a thread of a busy engine, where every blocking system
call gives up the GIL and may wait up to the 5 ms switch interval to get it back. A general
HTTP client cost the reports dozens of such steps (handoffs visible p50 38 ms with httpx,
26-32 ms over this path, docs/benchmarks.md). A request is one ``sendall``; an answer is
usually one ``recv``.

What it speaks: requests with a JSON body or none; answers framed by ``Content-Length``, by
chunks, or by the connection's end. Errors of the socket layer and malformed answers are
translated to the package's errors here, in ``translated``, and nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_none

from worker_client._retry import no_pause
from worker_client.errors import CoordinatorUnreachable, ProtocolError, WorkerClientError

CONNECT_TIMEOUT_S = 1.0
"""Connecting to the coordinator, a sidecar on loopback: a second is already a failure."""
TIMEOUT_S = 5.0
"""Any one send or receive of a call (not the event stream, which sets its own)."""
RECV_BYTES = 65536


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """The one place where the socket layer's errors become the package's.

    ``OSError`` (refused, reset, timed out; ``ssl.SSLError`` is one) → CoordinatorUnreachable;
    ``ValueError`` (a malformed head, chunk size or JSON line) → ProtocolError."""
    try:
        yield
    except WorkerClientError:
        raise
    except OSError as exc:
        raise CoordinatorUnreachable(f"{what}: {exc}") from exc
    except (ValueError, IndexError) as exc:
        raise ProtocolError(f"{what}: {exc}") from exc


@dataclass(frozen=True)
class Origin:
    """Where the coordinator listens, from its URL."""

    host: str
    port: int
    netloc: str
    tls: bool

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        return cls(parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80),
                   parts.netloc, tls)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loaded once: the system's CA store (SSL_CERT_FILE / SSL_CERT_DIR when set).
    return ssl.create_default_context()


def connect(origin: Origin, connect_timeout: float, timeout: float) -> socket.socket:
    """A connected socket (TLS-wrapped for ``https``) with TCP_NODELAY and ``timeout``."""
    sock = socket.create_connection((origin.host, origin.port), timeout=connect_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if origin.tls:
            sock = _tls_context().wrap_socket(sock, server_hostname=origin.host)
        sock.settimeout(timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def request_head(method: str, target: str, origin: Origin, headers: Mapping[str, str],
                 body: bytes | None = None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class ResponseReader:
    """An answer read incrementally: the head, then the body however it is framed.

    ``feed`` returns the body bytes that became available; ``complete`` turns true at the
    body's end (its length reached, or the last chunk). Raises ValueError on what it cannot
    parse (``translated`` makes that a ProtocolError)."""

    def __init__(self) -> None:
        self.status: int | None = None
        """None until the head has been read."""
        self.headers: dict[bytes, bytes] = {}
        self.complete = False
        self._raw = bytearray()
        self._chunked = False
        self._left: int | None = None
        """Body bytes still to come with ``Content-Length``; None: chunks, or until close."""

    @property
    def keeps_alive(self) -> bool:
        """Whether the connection can carry the next request."""
        framed = self._chunked or b"content-length" in self.headers
        return framed and self.headers.get(b"connection") != b"close"

    def feed(self, data: bytes) -> bytes:
        self._raw += data
        if self.status is None:
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return b""
            self._read_head(bytes(self._raw[:end]))
            del self._raw[: end + 4]
        if self._chunked:
            return self._dechunk()
        body = bytes(self._raw if self._left is None else self._raw[: self._left])
        self._raw.clear()
        if self._left is not None:
            self._left -= len(body)
            self.complete = self._left == 0
        return body

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip().lower()
        self._chunked = b"chunked" in self.headers.get(b"transfer-encoding", b"")
        if not self._chunked and b"content-length" in self.headers:
            self._left = int(self.headers[b"content-length"])
            self.complete = self._left == 0

    def _dechunk(self) -> bytes:
        """Every complete chunk's bytes; a partial chunk stays in the buffer."""
        raw, body = self._raw, bytearray()
        while not self.complete and (eol := raw.find(b"\r\n")) >= 0:
            size = int(bytes(raw[:eol]).split(b";", 1)[0], 16)
            if size == 0:
                self.complete = True
                break
            if len(raw) < eol + 2 + size + 2:
                break
            body += raw[eol + 2 : eol + 2 + size]
            del raw[: eol + 2 + size + 2]
        return bytes(body)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        with translated("reading the coordinator's answer"):
            return json.loads(self.body)


class Connection:
    """Requests to one coordinator over one kept-alive connection (thread-safe, one request
    at a time: give a thread on a hot path a connection of its own)."""

    def __init__(self, base_url: str, headers: Mapping[str, str], *,
                 connect_timeout: float = CONNECT_TIMEOUT_S, timeout: float = TIMEOUT_S) -> None:
        self._origin = Origin.of(base_url)
        self._headers = dict(headers)
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._reused = False
        self._lock = threading.Lock()
        # A kept-alive connection the coordinator closed meanwhile fails on first use: one
        # more attempt, at once, on a fresh one. A fresh connection that fails is not retried
        # here (the caller's own policy decides).
        self._retrying = Retrying(
            stop=stop_after_attempt(2), wait=wait_none(), sleep=no_pause, reraise=True,
            retry=retry_if_exception(lambda exc: self._reused
                                     and isinstance(exc, CoordinatorUnreachable)),
        )

    def request(self, method: str, path: str, body: Any = None) -> Answer:
        """The coordinator's answer, whatever its status; raises CoordinatorUnreachable or
        ProtocolError when there is none."""
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        message = request_head(method, path, self._origin, self._headers, payload)
        with self._lock:
            answer: Answer = self._retrying(self._exchange, message)
            return answer

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _exchange(self, message: bytes) -> Answer:
        self._reused = self._sock is not None
        try:
            with translated(f"{self._origin.netloc}"):
                if self._sock is None:
                    self._sock = connect(self._origin, self._connect_timeout, self._timeout)
                sock = self._sock
                sock.sendall(message)
                reader, body = ResponseReader(), bytearray()
                while not reader.complete:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        if reader.status is not None and not reader.keeps_alive:
                            break  # framed by the connection's end: that was all of it
                        raise ConnectionResetError("the coordinator closed the connection")
                    body += reader.feed(data)
        except WorkerClientError:
            self.close()
            raise
        assert reader.status is not None
        if not reader.keeps_alive:
            self.close()
        return Answer(reader.status, bytes(body))


def call_once(base_url: str, headers: Mapping[str, str], method: str, path: str,
              body: Any = None) -> Answer:
    """One request on a connection of its own, closed after it."""
    connection = Connection(base_url, headers)
    try:
        return connection.request(method, path, body)
    finally:
        connection.close()
