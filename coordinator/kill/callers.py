"""The processes waiting on this one over TCP: clients of its listening sockets.

The preStop hook runs inside the engine's container (``exec``), so it sits in the engine's
cgroup and mount namespace, and blocks on ``GET /drain`` until the drain it started is over.
Killing it with the engine would fail the hook and lose the summary it prints. It is told
apart by its connection: a process holding the client end of a TCP connection that one of our
listening sockets accepted is waiting for us, and unit membership never adopts it.

Read from ``/proc``: our socket inodes (``/proc/self/fd``), the connection table of our
network namespace (``/proc/self/net/tcp`` and ``tcp6``), and a candidate's socket inodes.
Addresses are compared as IP addresses, so a v4 client of a dual-stack v6 listener (shown
as ``::ffff:a.b.c.d`` on our side) still matches.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.kill import procfs

LISTEN = 0x0A
Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


@dataclass(frozen=True, slots=True)
class Socket:
    """One line of ``/proc/net/tcp`` or ``tcp6``."""

    local: Endpoint
    remote: Endpoint
    state: int
    inode: int
    uid: int = -1
    """The socket's owner (the effective UID of the process that made it)."""


def parse_endpoint(text: str) -> Endpoint:
    """``0100007F:1F90`` (v4) or 32 hex digits and a port (v6): each 32-bit word is printed
    in the kernel's byte order (little-endian on every platform we run on)."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if len(packed) == 4:
        ip = ipaddress.IPv4Address(packed)
    else:
        ip = ipaddress.IPv6Address(packed)
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return ip, int(port, 16)


def parse_net_tcp(text: str) -> list[Socket]:
    """The sockets of a ``/proc/net/tcp`` (or ``tcp6``) text; the header line is skipped."""
    out: list[Socket] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        out.append(Socket(parse_endpoint(fields[1]), parse_endpoint(fields[2]),
                          int(fields[3], 16), int(fields[9]), int(fields[7])))
    return out


def client_ends(sockets: Iterable[Socket], ours: set[int]) -> set[tuple[Endpoint, Endpoint]]:
    """``(local, remote)`` of the client end of each connection accepted by one of our
    listening sockets (``ours``: our socket inodes)."""
    mine = [s for s in sockets if s.inode in ours]
    ports = {s.local[1] for s in mine if s.state == LISTEN}
    return {(s.remote, s.local) for s in mine if s.state != LISTEN and s.local[1] in ports}


def socket_inodes(pid: int | str) -> set[int]:
    """The socket inodes a process holds open (empty when gone or not readable)."""
    fd_dir = f"{procfs.PROC}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return set()
    out: set[int] = set()
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def connections() -> list[Socket]:
    """Every TCP socket of our network namespace."""
    out: list[Socket] = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{procfs.PROC}/self/net/{name}") as f:
                out += parse_net_tcp(f.read())
        except OSError:
            continue
    return out


def clients(pids: Iterable[int]) -> set[int]:
    """Which of ``pids`` hold the client end of a connection to one of our listeners."""
    pids = list(pids)
    if not pids:
        return set()
    sockets = connections()
    ends = client_ends(sockets, socket_inodes("self"))
    if not ends:
        return set()
    wanted = {s.inode for s in sockets if (s.local, s.remote) in ends and s.inode}
    return {pid for pid in pids if socket_inodes(pid) & wanted}
