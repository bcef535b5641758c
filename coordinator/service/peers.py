"""Who is calling, when no token says it: the owner of the client end of its TCP connection.

The connection's two ends are in the request (``client``, ``server``); the socket whose local
end is the client's and whose remote end is ours is found by one exact lookup in the kernel
(``coordinator.service.sock_diag``), and its owner is the caller's UID. A socket's owner never
changes, so the answer is kept for the connection (``PeerCache``, which the HTTP protocol
puts in every request's scope): a worker's keep-alive connection costs one lookup, not one
per report.

A caller whose socket is not in our network namespace (another host, another pod) has no
UID here (``Peer.uid`` None). A lookup that fails (netlink socket diagnostics blocked) says
why (``Peer.error``); it is not kept, so the next request asks again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.service import sock_diag

SCOPE_KEY = "coordinator.peer"
"""Where a request's scope holds its connection's ``PeerCache`` (absent: no cache)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """The caller at the other end of a connection."""

    uid: int | None
    """The UID owning the client's socket; None when it is not in our network namespace, or
    when it could not be looked up (``error``)."""
    error: str | None = None
    """Why the lookup failed (None: it did not)."""

    @property
    def local(self) -> bool:
        return self.uid is not None


class PeerCache:
    """One connection's caller, looked up at most once."""

    __slots__ = ("peer",)

    def __init__(self) -> None:
        self.peer: Peer | None = None


def lookup(client: Any, server: Any) -> Peer:
    """The owner of the client end of the connection ``client`` → ``server`` (each a
    ``(host, port)`` as ASGI gives them)."""
    if not client or not server:
        return Peer(None)
    try:
        return Peer(sock_diag.owner((str(client[0]), int(client[1])),
                                    (str(server[0]), int(server[1]))))
    except (ValueError, TypeError, IndexError):
        return Peer(None)  # not an IP connection (a unix socket): no TCP owner to find
    except sock_diag.SockDiagUnavailable as exc:
        return Peer(None, str(exc))


def of_request(scope: Any) -> Peer:
    """The caller of the request whose ASGI ``scope`` is given (kept for its connection)."""
    cache = scope.get(SCOPE_KEY)
    if isinstance(cache, PeerCache) and cache.peer is not None:
        return cache.peer
    peer = lookup(scope.get("client"), scope.get("server"))
    if isinstance(cache, PeerCache) and peer.error is None:
        cache.peer = peer
    return peer
