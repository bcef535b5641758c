"""Which process serves a TCP port: the owner of the listening socket, read from ``/proc``.

An adopted engine's in-flight count comes from one metrics URL, but a pod may adopt more than
one tree. The count belongs to the tree whose process listens on the URL's port, so
``/status`` can show it on that root and on no other:

    1. the inodes of the sockets listening on the port, from ``/proc/net/tcp`` and
       ``/proc/net/tcp6`` (state ``0A``, any local address: an engine bound to ``0.0.0.0``
       serves ``127.0.0.1`` too);
    2. the first candidate process holding one of them (a ``socket:[inode]`` link among its
       fds). Candidates are the adopted roots first, then their descendants, so the usual case
       (the engine's API server is the root) reads one process's fds.

The reads see the coordinator's own network namespace: the pod's, which the engine shares.
A process whose fds cannot be read (gone, or another user's) is passed over.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

PROC = "/proc"
LISTEN = "0A"
"""``include/net/tcp_states.h``: ``TCP_LISTEN`` as ``/proc/net/tcp`` prints it."""


def listening_inodes(port: int, proc: str = PROC) -> set[int]:
    """Inodes of the TCP sockets (IPv4 and IPv6) listening on ``port``."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                next(f, None)  # the header line
                for line in f:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != LISTEN:
                        continue
                    _, _, local_port = fields[1].rpartition(":")
                    if int(local_port, 16) == port and fields[9] != "0":
                        inodes.add(int(fields[9]))
        except (OSError, ValueError):
            continue  # no IPv6 in this namespace, or a table that does not parse
    return inodes


def holds_socket(pid: int, inodes: set[int], proc: str = PROC) -> bool:
    """Whether process ``pid`` has one of the sockets ``inodes`` among its fds."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"{proc}/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue  # closed since the listing
    return False


def port_owner(port: int, candidates: Iterable[int], proc: str = PROC) -> int | None:
    """The first of ``candidates`` that holds a socket listening on ``port``, or None."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    for pid in candidates:
        if holds_socket(pid, inodes, proc):
            return pid
    return None
