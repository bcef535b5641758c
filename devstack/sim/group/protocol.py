"""The collective's wire: one JSON object per line over TCP, every rank to rank 0.

Rank 0 is the hub (a star, where NCCL has rings and trees: what matters here is that no
step completes until every rank took part, and that a rank gone makes the others wait)::

    rank R   → rank 0   {"op": "join", "rank": R, "pid", "node_rank"}
    rank 0   → rank R   {"op": "welcome", "world_size": W}      once all W ranks joined
    front end → rank 0  {"op": "drive"}   → {"op": "driving", "world_size": W}
    front end → rank 0  {"op": "step"}    → every rank {"op": "step", "n": K}
    rank R   → rank 0   {"op": "ack", "n": K}
    rank 0   → rank R   {"op": "done", "n": K}                    every rank acked step K
    rank 0   → front end {"op": "stepped", "n": K}
    front end → rank 0  {"op": "finish"}  (or rank 0's own SIGTERM) → every rank
                        {"op": "finish"}, each answers {"op": "bye", "steps": K}
    rank 0   → front end {"op": "finished", "ranks": {"R": "bye" | "gone" | "no answer"}}

How a rank ended is its record's ``cause`` (one of ``CAUSES``).
"""

from __future__ import annotations

import collections
import json
import select
import socket
import time
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from devstack.sim.errors import SimError, SimStartupError

Message = dict[str, Any]

CAUSE_FINISHED = "finished"
"""It left when the group finished: told by rank 0, or rank 0 itself after telling them."""
CAUSE_LEFT = "left on SIGTERM"
"""It left the group on its own SIGTERM, while rank 0 may still issue steps."""
CAUSE_TIMED_OUT = "collective timed out"
"""A step did not complete within the timeout (a rank gone or silent): it aborted."""
CAUSES = (CAUSE_FINISHED, CAUSE_LEFT, CAUSE_TIMED_OUT)

CONNECT_RETRY_S = 0.05
"""Between attempts to reach rank 0 while the leader pod is not listening yet (pods of a
LeaderWorkerSet start in any order, as torch.distributed's rendezvous allows)."""


class PeerGone(SimError):
    """The other end closed the connection."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` → ``(host, port)``."""
    host, _, port = addr.rpartition(":")
    return host, int(port)


class Channel:
    """One rank's connection, read into an inbox of whole messages."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.inbox: collections.deque[Message] = collections.deque()
        self.gone = False
        self._buffer = b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Message) -> bool:
        """False when the peer is gone (which the step that needs it will find out)."""
        try:
            self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        except OSError:
            return False
        return True

    def fill(self) -> None:
        """Read what arrived (call when readable): whole messages go to the inbox; the end
        of the stream (or a reset) sets ``gone``."""
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.gone = True
            return
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        self.inbox.extend(json.loads(line) for line in lines if line.strip())

    def next(self, deadline: float) -> Message | None:
        """The next message, None at the deadline; ``PeerGone`` once the inbox is empty and
        the peer closed."""
        while not self.inbox:
            if self.gone:
                raise PeerGone("the peer closed the connection")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            self.fill()
        return self.inbox.popleft()

    def close(self) -> None:
        self.sock.close()


def connect(addr: str, deadline: float) -> Channel:
    """Reach rank 0 at ``HOST:PORT``, retrying until ``deadline`` (monotonic)."""
    host, port = parse_addr(addr)
    retrying = Retrying(
        stop=stop_after_delay(max(deadline - time.monotonic(), 0.0)),
        wait=wait_fixed(CONNECT_RETRY_S),
        retry=retry_if_exception_type(OSError),
        reraise=True,
    )
    try:
        sock = retrying(socket.create_connection, (host, port), timeout=CONNECT_RETRY_S * 20)
    except OSError as exc:
        raise SimStartupError(f"could not reach rank 0 at {addr}: {exc}") from exc
    sock.settimeout(None)
    return Channel(sock)


def listen(addr: str) -> socket.socket:
    """Rank 0's listening socket on ``HOST:PORT``."""
    host, port = parse_addr(addr)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SimStartupError(f"rank 0 cannot listen on {addr}: {exc.strerror}") from exc
    sock.listen(256)
    return sock
