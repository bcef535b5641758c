"""The door stays open for the kubelet: under a flood of connections that send nothing and
come back as soon as they are closed, four times the connection cap, every probe and the
kubelet's ``GET /drain`` are answered, and a request already being answered (a long-poll) is
never closed to make room.

No timing is asserted: each probe only has to be answered (the kubelet's own timeout is
seconds; ``bench/door_flood.py`` measures the answer times). A probe whose client is
descheduled between its connect and its first byte, while the flood opens the cap's worth of
newer connections, can still be closed for room (seen once in about 40 probes at a load
average of 6 under coverage). The kubelet tries a failed probe again next period and only
acts after ``failureThreshold`` failures in a row (3 by default), and the shipped drain hook
asks again after a reset: so a probe may meet a closed connection, never a wrong answer, and
never ``KUBELET_ATTEMPTS`` times in a row.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from bench import door_flood
from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

CAP = 16
"""``--max-connections`` at its least."""
FLOOD_CONNECTIONS = 4 * CAP


KUBELET_ATTEMPTS = 3
"""A probe's ``failureThreshold`` by default: failures in a row before the kubelet acts."""
CLOSED_FOR_ROOM = ("closed", "ConnectionResetError", "BrokenPipeError")
"""What a client whose connection was closed to make room sees (``door_flood.ask``)."""


def ask(port: int, path: str) -> int | str:
    """One kubelet-shaped request on a fresh connection: its status, or why none came."""
    return door_flood.ask(port, path, timeout_s=60)[0]


def ask_as_the_kubelet(port: int, path: str) -> list[int | str]:
    """Up to ``KUBELET_ATTEMPTS`` requests, until one is answered: every attempt's result."""
    attempts: list[int | str] = []
    while len(attempts) < KUBELET_ATTEMPTS:
        attempts.append(ask(port, path))
        if attempts[-1] not in CLOSED_FOR_ROOM:
            break
    return attempts


def test_probes_and_the_drain_are_answered_under_a_reconnecting_flood(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator capped at 16 connections; a router's long-poll waits on ``/status``;
    2. 64 connections that send nothing, each reopened as soon as it is closed, until the
       coordinator has closed many of them (it is full);
    3. 20 probes of ``/healthz`` and 20 of ``/readyz``, each on a fresh connection, tried
       again as the kubelet does: each answered 200 within ``KUBELET_ATTEMPTS``, every other
       attempt a connection closed for room, never another answer;
    4. the kubelet's ``GET /drain``, asked again after a reset as the drain hook does: 200,
       ``done``;
    5. the long-poll, whose whole request the coordinator had read (its socket's receive
       queue empty), was not closed for room: it is answered (200) with the drain's newer
       generation."""
    running = start_coordinator(janitor, tmp_path, "--max-connections", str(CAP),
                                "--long-poll-cap", "600")
    port = urlsplit(running.url).port
    assert port is not None
    generation = running.status()["generation"]
    poll = socket.create_connection(("127.0.0.1", port), timeout=600)
    poll.sendall(f"GET /status?wait=600&since={generation} HTTP/1.1\r\nHost: 127.0.0.1:"
                 f"{port}\r\nConnection: close\r\n\r\n".encode())
    # The coordinator has read the whole request once its socket's receive queue is empty.
    mine = poll.getsockname()[1]
    wait_for(lambda: _receive_queue(port, mine) == 0 or None, what="the long-poll read")

    flood = janitor.spawn([sys.executable, "-c", door_flood.FLOOD, "127.0.0.1", str(port),
                           str(FLOOD_CONNECTIONS)], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: _established(port) >= CAP or None,
                 what="the coordinator full of flood connections")
        # 3.
        probes = [ask_as_the_kubelet(port, path)
                  for _ in range(20) for path in ("/healthz", "/readyz")]
        assert [attempts[-1] for attempts in probes] == [200] * 40, probes
        assert all(a in CLOSED_FOR_ROOM for attempts in probes for a in attempts[:-1]), probes
        # 4.
        assert ask_as_the_kubelet(port, "/drain")[-1] == 200
    finally:
        flood.send_signal(signal.SIGTERM)
        flood.wait(timeout=60)
    # 5.
    with poll:
        answer = b""
        while chunk := poll.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:200]
    assert json.loads(body)["generation"] > generation
    assert running.status()["phase"] == "done"


def _receive_queue(port: int, client_port: int) -> int | None:
    """Bytes waiting unread in the coordinator's end of the connection from ``client_port``
    (``/proc/net/tcp``); None when there is no such connection."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local = int(fields[1].rsplit(":", 1)[1], 16)
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                if (local, remote) == (port, client_port):
                    return int(fields[4].split(":")[1], 16)
    return None


def _established(port: int) -> int:
    """Connections to ``port`` the kernel holds established, from ``/proc/net/tcp``."""
    count = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count
