"""What the kernel says of a loopback TCP connection, for tests that must know a request was
read by the server (not merely sent) before they act."""

from __future__ import annotations

from pathlib import Path


def tcp_queues(server_port: int, client_port: int) -> tuple[int, int] | None:
    """(unacknowledged bytes the client sent, bytes waiting unread at the server) on the
    loopback connection between the two ports, from /proc/net/tcp; None until it is up."""
    client_tx = server_rx = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
        if state != "01":  # ESTABLISHED
            continue
        ports = (int(local.split(":")[1], 16), int(remote.split(":")[1], 16))
        tx, rx = (int(q, 16) for q in queues.split(":"))
        if ports == (client_port, server_port):
            client_tx = tx
        elif ports == (server_port, client_port):
            server_rx = rx
    return None if client_tx is None or server_rx is None else (client_tx, server_rx)
