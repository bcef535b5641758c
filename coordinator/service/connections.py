"""Bounds on connections, before any request reaches the app: how many, how long a request's
head may take, how large it may be.

uvicorn's own keep-alive timer only starts after a response, and any byte received stops it:
a connection that never sends a request, or sends its head a byte at a time, is otherwise
held for as long as the client likes, and an endless head grows in memory. So, per
connection:

    1. past ``max_connections`` open connections, the connection that has waited longest
       without giving a whole request (first one that never sent a byte, then one whose head
       is still coming, then one whose body is) is closed to make room for the new one; only
       when every connection carries a request being answered (long-polls, event streams, a
       waiting ``GET /drain``) is the new one answered 503 and closed. A flood of clients
       that connect and send nothing, reconnecting as soon as they are closed, so never
       locks out the kubelet: its probe or ``GET /drain`` is the newest connection and sends
       its head at once, and is answered before the flood's ``max_connections`` newer
       connections could push it out. A connection whose first bytes wait in the kernel,
       not yet read (a loaded loop accepts a batch of connections before it reads any), has
       sent something and is not taken for one that never did;
    2. each request's head (request line and headers) must arrive whole within
       ``head_timeout_s`` of the connection opening or the previous response ending, else the
       connection is closed;
    3. a head larger than ``MAX_HEAD_BYTES`` is answered 431 and the connection closed;
    4. a close while the client is still sending its request lingers: the answer is flushed
       and our side shut for writing, then what the client still sends is read and dropped
       (``LINGER_S``, ``LINGER_MAX_BYTES`` at most). Closing a socket with unread input makes
       the kernel send a reset that discards the answer not yet delivered, so a client cut
       off mid-body (401, 413, 408, 431) would otherwise see "connection reset" instead of
       the reason.

What follows the head (the body's size and pace) is the request guard's. Each request's
scope carries its connection's ``peers.PeerCache``, so the caller's socket is looked up once
per connection, not once per request.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import termios
from collections import OrderedDict
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from coordinator.service.peers import SCOPE_KEY, PeerCache

MAX_HEAD_BYTES = 65_536
"""Request line and headers together; a bearer token and a few headers need far less."""
LINGER_S = 2.0
"""Seconds a closing connection keeps reading (and dropping) what the client still sends."""
LINGER_MAX_BYTES = 4 * 1024 * 1024
"""Bytes a closing connection drops at most before it closes anyway."""


class LingeringTransport:
    """The transport uvicorn sees: ``close`` starts a lingering close (step 4)."""

    def __init__(self, transport: asyncio.Transport, linger: Any) -> None:
        self.raw = transport
        self._linger = linger
        self._closing = False

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._linger()

    def is_closing(self) -> bool:
        return self._closing or self.raw.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


IDLE, HEAD, BODY = 0, 1, 2
"""What a connection without a whole request waits for, in the order they give way (step 1):
its request's first byte, the rest of its head, the rest of its body."""


def guarded_protocol(max_connections: int, head_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the bounds above (pass it as ``Config(http=...)``)."""

    waiting: tuple[OrderedDict[Any, None], ...] = (OrderedDict(), OrderedDict(), OrderedDict())
    """The connections without a whole request, by what they wait for, each oldest first
    (shared by every connection of one server)."""

    class GuardedHttpProtocol(HttpToolsProtocol):
        def __init__(self, config: Config, server_state: ServerState,
                     app_state: dict[str, Any],
                     _loop: asyncio.AbstractEventLoop | None = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self.head_timer: asyncio.TimerHandle | None = None
            self.linger_timer: asyncio.TimerHandle | None = None
            self.in_head = True
            self.head_bytes = 0
            self.raw: asyncio.Transport | None = None
            self.lingering = False
            self.dropped = 0
            self.peer = PeerCache()
            self.rank: int | None = None
            """Which of ``waiting`` holds this connection (None: none)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.raw = transport
            super().connection_made(LingeringTransport(transport, self._linger))  # type: ignore[arg-type]
            # Step 1.
            if len(self.connections) > max_connections and not self._evict_one():
                self._refuse(503, b"too many connections (max_connections)")
                return
            self._wait_for(IDLE)
            self._arm_head_timer()

        def _wait_for(self, rank: int | None) -> None:
            """Move this connection to ``waiting[rank]`` (its newest), or out of them."""
            if self.rank is not None:
                waiting[self.rank].pop(self, None)
            self.rank = rank
            if rank is not None:
                waiting[rank][self] = None

        def _evict_one(self) -> bool:
            """Close the connection that has waited longest without a whole request; False
            when there is none."""
            for rank, queue in enumerate(waiting):
                for victim in queue:
                    if victim is not self and not (rank == IDLE and victim.unread()):
                        victim.evict()
                        return True
            return False

        def unread(self) -> bool:
            """Bytes from the client wait in the kernel, not yet read by the loop."""
            sock = self.raw.get_extra_info("socket") if self.raw is not None else None
            if sock is None:
                return False
            pending = array.array("i", [0])
            try:
                fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending)
            except OSError:
                return False
            return pending[0] > 0

        def evict(self) -> None:
            """Closed to make room (step 1): at once, nothing of it is worth an answer."""
            self._wait_for(None)
            self._disarm_head_timer()
            self.in_head = False
            if self.raw is not None and not self.raw.is_closing():
                self.raw.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._wait_for(None)
            self._disarm_head_timer()
            if self.linger_timer is not None:  # the client closed first: nothing to drop
                self.linger_timer.cancel()
                self.linger_timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.lingering:
                self.dropped += len(data)
                if self.dropped > LINGER_MAX_BYTES:
                    self._close_now()
                return
            heading = self.in_head
            super().data_received(data)
            if heading and self.in_head:
                # Step 3: still no whole head (one that ends within ``data`` has reset this).
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                    self._refuse(431, b"request head too large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[SCOPE_KEY] = self.peer  # type: ignore[literal-required]
            if self._answered():
                self._wait_for(HEAD)

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()
            self.in_head, self.head_bytes = False, 0
            if self._answered():
                self._wait_for(BODY)
            super().on_headers_complete()

        def _answered(self) -> bool:
            """No request of this connection is being answered (a pipelined one's head may
            come meanwhile: the connection is not evicted from under that answer)."""
            return self.cycle is None or self.cycle.response_complete

        def on_message_complete(self) -> None:
            self._wait_for(None)  # a whole request: it is answered, never evicted
            super().on_message_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # the next request's head is in already
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self.in_head, self.head_bytes = True, 0
                self._wait_for(IDLE)
                self._arm_head_timer()

        # Step 2.
        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self.head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_timed_out(self) -> None:
            self.head_timer = None
            if self.in_head and not self.transport.is_closing():
                self.transport.close()

        def eof_received(self) -> None:
            if self.lingering:
                self._close_now()

        # Step 4.
        def _linger(self, receiving: bool = False) -> None:
            raw = self.raw
            if raw is None or raw.is_closing() or self.lingering:
                return
            self._disarm_head_timer()
            receiving = receiving or (self.head_bytes > 0 if self.in_head else bool(
                self.cycle is not None and self.cycle.more_body))
            self._wait_for(None)
            if not receiving:
                raw.close()  # nothing unread can be on its way: no reset to fear
                return
            self.lingering = True
            try:
                raw.write_eof()
                raw.resume_reading()
            except (OSError, RuntimeError, NotImplementedError):
                raw.close()
                return
            self.linger_timer = self.loop.call_later(LINGER_S, self._close_now)

        def _close_now(self) -> None:
            if self.raw is not None and not self.raw.is_closing():
                self.raw.close()

        def _refuse(self, status: int, reason: bytes) -> None:
            self._wait_for(None)
            self._disarm_head_timer()
            self.in_head = False
            line = b"HTTP/1.1 %d %s\r\n" % (status, reason.split(b" (")[0].capitalize())
            body = b'{"detail": "' + reason + b'"}'
            self.transport.write(line + b"content-type: application/json\r\ncontent-length: "
                                 + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + body)
            self._linger(receiving=True)

    return GuardedHttpProtocol
