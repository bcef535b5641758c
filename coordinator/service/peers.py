"""Who is calling, for registrations made without a token: a process registered here is
SIGTERMed and SIGKILLed by the next drain, so without a token only a caller that could
signal it itself may register it.

The caller is the owner of the client end of its TCP connection, read from the connection
table of our network namespace (``/proc/self/net/tcp`` and ``tcp6``: the line whose local
address is the caller's and whose remote address is ours). The rule is ``kill(2)``'s, as far
as a socket's owner tells it: root may register any process; another UID only a process
whose real or saved UID is its own. A caller not found in the table (not on this host's
network namespace) may not register anything without the token.
"""

from __future__ import annotations

import ipaddress

import psutil

from coordinator.errors import RefusedTarget, TargetNotFound
from coordinator.kill import callers

ROOT_UID = 0


def peer_uid(client: tuple[str, int] | None, server: tuple[str, int] | None) -> int | None:
    """The UID owning the client end of the connection ``client`` → ``server``; None when
    it is not in this network namespace's table (or the addresses are unknown)."""
    if client is None or server is None:
        return None
    theirs, ours = _endpoint(client), _endpoint(server)
    if theirs is None or ours is None:
        return None
    for sock in callers.connections():
        if sock.local == theirs and sock.remote == ours and sock.uid >= 0:
            return sock.uid
    return None


def _endpoint(address: tuple[str, int]) -> callers.Endpoint | None:
    """An address as the connection table shows it (a v4-mapped v6 address as v4)."""
    try:
        ip = ipaddress.ip_address(address[0])
        port = int(address[1])
    except (ValueError, TypeError, IndexError):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, port
    return ip, port


def check_may_register(caller_uid: int | None, pid: int) -> None:
    """Raise ``RefusedTarget`` unless a caller of ``caller_uid`` may signal ``pid``."""
    if caller_uid is None:
        raise RefusedTarget(pid, "the caller is not a process of this host (its connection "
                            "is not in our network namespace): registering without a token "
                            "needs a local caller")
    if caller_uid == ROOT_UID:
        return
    try:
        uids = psutil.Process(pid).uids()
    except psutil.NoSuchProcess as exc:
        raise TargetNotFound(pid, "no such process") from exc
    except psutil.Error as exc:
        raise RefusedTarget(pid, f"its owner cannot be read ({exc})") from exc
    if caller_uid not in (uids.real, uids.saved):
        raise RefusedTarget(pid, f"it belongs to UID {uids.real} and the caller is UID "
                            f"{caller_uid}: without the token a caller may only register "
                            "processes it could signal itself (give the token, or register "
                            "from the process's own user)")
