"""The owner of one TCP socket of our network namespace, found by the kernel in one lookup.

``owner(local, remote)`` asks the kernel's socket diagnostics (netlink ``NETLINK_SOCK_DIAG``,
``SOCK_DIAG_BY_FAMILY`` without ``NLM_F_DUMP``) for the socket whose local end is ``local``
and remote end ``remote``. Without the dump flag the kernel answers from its connection hash
(``inet_diag_find_one_icsk``): one lookup of that 4-tuple, whatever the number of sockets on
the host, where reading ``/proc/net/tcp`` formats and parses every one of them (200 to 400 ms of
CPU with 30,000 to 40,000 idle loopback connections, which any local user can open).

The answer is the socket's owner (the effective UID of the process that made it, as the
kernel records it) and its inode, as seen from our user namespace. Only a socket that a
process still holds counts: a connection in ``TIME_WAIT`` or a half-open request has no
inode and the kernel reports UID 0 for it, so those are answered as not found, never as
root. Unprivileged: any process may ask about sockets of its own network namespace.

Errors, as a tree::

    SockDiagUnavailable (an OSError: netlink socket diagnostics cannot be used here)
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NO_COOKIE = 0xFFFFFFFF
TCP_ESTABLISHED, TCP_SYN_RECV, TCP_TIME_WAIT, TCP_LISTEN, TCP_NEW_SYN_RECV = 1, 3, 6, 10, 12
NOT_HELD = frozenset({TCP_SYN_RECV, TCP_TIME_WAIT, TCP_LISTEN, TCP_NEW_SYN_RECV})
"""States in which the kernel reports no owner (UID 0, inode 0), or that are no connection."""
ALL_STATES = 0xFFFFFFFF

_HEADER = struct.Struct("=IHHII")
"""``struct nlmsghdr``: length, type, flags, sequence, port id."""
_REQUEST = struct.Struct("=BBBxI")
"""``struct inet_diag_req_v2`` up to its socket id: family, protocol, extensions, states."""
_SOCKID = struct.Struct("!HH16s16s")
"""``struct inet_diag_sockid`` up to the interface: ports and addresses, network order."""
_TAIL = struct.Struct("=III")
"""The socket id's interface and cookie (host order)."""
_MESSAGE = struct.Struct("=BBBB")
"""``struct inet_diag_msg`` up to its socket id: family, state, timer, retransmits."""
_OWNER = struct.Struct("=IIIII")
"""After the socket id: expires, receive queue, send queue, UID, inode."""
REPLY_BYTES = 8192
V4_MAPPED = bytes(10) + b"\xff\xff"

Endpoint = tuple[str, int]


class SockDiagUnavailable(OSError):
    """Netlink socket diagnostics cannot be used here (no ``AF_NETLINK``, a seccomp or
    systemd ``RestrictAddressFamilies`` filter)."""


def available() -> str | None:
    """None when a netlink socket-diagnostics socket can be opened here, else why not."""
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def owner(local: Endpoint, remote: Endpoint) -> int | None:
    """The UID owning the TCP socket ``local`` → ``remote`` of our network namespace, held
    by a process; None when there is no such socket (a connection from another host or
    namespace, or one already closed). ``SockDiagUnavailable`` when the kernel cannot be
    asked; ``ValueError`` for an address that is not an IP address."""
    family, src, dst = _addresses(local[0], remote[0])
    request = _HEADER.pack(_HEADER.size + _REQUEST.size + _SOCKID.size + _TAIL.size,
                           SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    request += _REQUEST.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES)
    request += _SOCKID.pack(local[1], remote[1], src, dst)
    request += _TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.sendto(request, (0, 0))
            reply = nl.recv(REPLY_BYTES)
    except OSError as exc:
        raise SockDiagUnavailable(exc.errno, f"sock_diag: {exc.strerror or exc}") from exc
    return _owner_from(reply, local, remote, family, src, dst)


def _addresses(local: str, remote: str) -> tuple[int, bytes, bytes]:
    """The family and the two addresses as the kernel's socket id holds them (16 bytes
    each). A v4-mapped v6 pair is asked as IPv4: the kernel hashes such a connection in its
    IPv4 table, whichever family the socket was made in."""
    src, dst = _packed(local), _packed(remote)
    if len(src) == len(dst) == 4:
        return socket.AF_INET, src.ljust(16, b"\0"), dst.ljust(16, b"\0")
    return socket.AF_INET6, _as_v6(src), _as_v6(dst)


def _packed(address: str) -> bytes:
    """An IP address in 4 bytes (IPv4, or v4-mapped IPv6) or 16; ``ValueError`` otherwise."""
    text = address.split("%", 1)[0]  # a link-local address's zone
    try:
        if ":" not in text:
            return socket.inet_pton(socket.AF_INET, text)
        raw = socket.inet_pton(socket.AF_INET6, text)
    except OSError:
        raise ValueError(f"{address!r} is not an IP address") from None
    return raw[12:] if raw[:12] == V4_MAPPED else raw


def _as_v6(raw: bytes) -> bytes:
    return raw if len(raw) == 16 else V4_MAPPED + raw


def _owner_from(reply: bytes, local: Endpoint, remote: Endpoint, family: int, src: bytes,
                dst: bytes) -> int | None:
    """The owner in a reply to ``owner``'s request, after checking it is that socket."""
    offset = 0
    while offset + _HEADER.size <= len(reply):
        length, kind, _flags, _seq, _port = _HEADER.unpack_from(reply, offset)
        body = offset + _HEADER.size
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", reply, body)[0]
            if errno in (0, 2):  # ENOENT: no such socket here
                return None
            raise SockDiagUnavailable(errno, f"sock_diag: {os.strerror(errno)}")
        if kind == NLMSG_DONE:
            return None
        if kind == SOCK_DIAG_BY_FAMILY:
            got_family, state, _, _ = _MESSAGE.unpack_from(reply, body)
            sport, dport, got_src, got_dst = _SOCKID.unpack_from(reply, body + _MESSAGE.size)
            at = body + _MESSAGE.size + _SOCKID.size + _TAIL.size
            uid, inode = _OWNER.unpack_from(reply, at)[3:5]
            same = ((sport, dport) == (local[1], remote[1])
                    and _plain(got_src, got_family) == _plain(src, family)
                    and _plain(got_dst, got_family) == _plain(dst, family))
            if not same or state in NOT_HELD or inode == 0:
                return None
            return int(uid)
        if length < _HEADER.size:
            break
        offset += (length + 3) & ~3
    return None


def _plain(raw: bytes, family: int) -> bytes:
    """A socket id's address in 4 bytes or 16, a v4-mapped one in 4 (a v6 socket may carry
    one)."""
    if family == socket.AF_INET:
        return raw[:4]
    return raw[12:] if raw[:12] == V4_MAPPED else raw
