"""Which process serves a TCP port: the owner of the listening socket, read from ``/proc``.

An adopted engine's in-flight count comes from one metrics URL, but a pod may adopt more than
one tree. The count belongs to the tree whose process listens on the URL's port, so
``/status`` can show it on that root and on no other:

    1. the inodes of the sockets listening on the port, any local address (an engine bound
       to ``0.0.0.0`` serves ``127.0.0.1`` too), from the connection table of our network
       namespace (the pod's, which the engine shares);
    2. the first candidate process holding one of them among its fds. Candidates are the
       adopted roots first, then their descendants, so the usual case (the engine's API
       server is the root) reads one process's fds.

A process whose fds cannot be read (gone, or another user's) is passed over. The table and
fd readers are the kill engine's (``coordinator.kill.callers``), which tells the preStop hook
apart by its connection the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.kill import callers


def port_owner(port: int, candidates: Iterable[int]) -> int | None:
    """The first of ``candidates`` that holds a socket listening on ``port``, or None."""
    listening = {s.inode for s in callers.connections()
                 if s.state == callers.LISTEN and s.local[1] == port and s.inode}
    if not listening:
        return None
    for pid in candidates:
        if callers.socket_inodes(pid) & listening:
            return pid
    return None
