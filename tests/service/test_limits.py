"""Bounded resources at the door: a body is refused on its size before it is read (and before
the token is even looked at twice), a body or head that dribbles is cut off, a head that never
ends is refused, idle connections are closed, and the connection count has a cap.

Every check is made on raw sockets against a real ``serve`` process, and judged on the
process's own ``/proc`` entries (resident memory, open descriptors), not on what it reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.service.servers import Running, start_coordinator
from tests.support.fd_limits import fd_room
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "limits-token"
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def connection(running: Running) -> Iterator[socket.socket]:
    url = urlsplit(running.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=60)
    try:
        yield sock
    finally:
        sock.close()


def head(method: str, path: str, *lines: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n" + "".join(f"{h}\r\n" for h in lines)
            + "\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, object] | None]:
    """Read until the server closes the connection; the status and the JSON body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body) if body else None


def readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has data or EOF within ``timeout_s`` (poll: fds past 1024 too)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed its end (reading gives EOF), waiting up to 60 s."""
    return readable(sock, 60) and sock.recv(65536) == b""


def test_a_huge_unauthenticated_body_is_refused_before_it_is_read(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator with a token; 2. a POST without the token announcing 200 MiB, then
    its body streamed until the server stops taking it; 3. the answer is 401 and the
    connection closed; 4. the coordinator's resident memory grew by far less than the body
    (before the guard, the whole body was read first: +187 MiB)."""
    running = start_coordinator(janitor, tmp_path, token=TOKEN)
    before = rss_bytes(running.proc.pid)
    with connection(running) as sock:
        sock.sendall(head("POST", "/workers", "content-type: application/json",
                          f"content-length: {200 * MIB}"))
        sock.settimeout(5)
        sent = 0
        with contextlib.suppress(OSError):
            while sent < 200 * MIB:
                sent += sock.send(b"x" * MIB)
        sock.settimeout(60)
        status, body = read_response(sock)
    assert status == 401
    assert body is not None
    assert "bearer token" in str(body["detail"])
    assert sent < 200 * MIB
    assert rss_bytes(running.proc.pid) - before < 16 * MIB
    assert running.client().get("/status").status_code == 200


def test_an_oversized_body_is_refused_on_its_length_and_a_chunked_one_as_it_grows(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator with the smallest body limit (2 MiB); 2. an authenticated POST
    announcing 3 MiB answers 413 naming the limit, without its body being sent; 3. a chunked
    body that grows past the limit answers 413 too; 4. a body within the limit is served
    (422: not a registration, but read and judged)."""
    limit = 2 * MIB
    running = start_coordinator(janitor, tmp_path, "--max-body-bytes", str(limit), token=TOKEN)
    auth = f"authorization: Bearer {TOKEN}"
    with connection(running) as sock:
        sock.sendall(head("POST", "/workers", auth, "content-type: application/json",
                          f"content-length: {3 * MIB}"))
        status, body = read_response(sock)
    assert status == 413
    assert body is not None
    assert f"{limit} bytes (max_body_bytes)" in str(body["detail"])
    with connection(running) as sock:
        sock.sendall(head("POST", "/workers", auth, "content-type: application/json",
                          "transfer-encoding: chunked"))
        with contextlib.suppress(OSError):
            for _ in range(3 * MIB // 0x4000):
                sock.sendall(b"4000\r\n" + b"x" * 0x4000 + b"\r\n")
        status, body = read_response(sock)
    assert status == 413
    with running.client() as client:
        answer = client.post("/workers", content=b"[" + b" " * (limit - 1024) + b"]",
                             headers={"content-type": "application/json"})
    assert answer.status_code == 422


def test_a_body_that_dribbles_is_cut_off(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. ``--read-timeout 1``; 2. an authenticated POST announcing 100 bytes sends 10 and
    stops; 3. the answer is 408 naming the limit, and the connection is closed."""
    running = start_coordinator(janitor, tmp_path, "--read-timeout", "1", token=TOKEN)
    with connection(running) as sock:
        sock.sendall(head("POST", "/workers", f"authorization: Bearer {TOKEN}",
                          "content-type: application/json", "content-length: 100")
                     + b'{"pid": 12')
        status, body = read_response(sock)
    assert status == 408
    assert body is not None
    assert "read_timeout_s" in str(body["detail"])


def test_idle_and_dribbling_connections_are_closed(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """1. ``--read-timeout 1``; 2. 1,100 connections that send nothing, one that sends half
    a request line, and one that sends a header line whenever the previous one was taken
    (data arriving does not restart the clock); 3. the server closes every one of them;
    4. its open descriptors are back to what they were before."""
    running = start_coordinator(janitor, tmp_path, "--read-timeout", "1", token=TOKEN)
    pid = running.proc.pid
    baseline = open_fds(pid)
    url = urlsplit(running.url)
    with fd_room(1200):
        _idle_and_dribbling(running, url.hostname or "", url.port or 0)
    wait_for(lambda: open_fds(pid) <= baseline or None, what="descriptors released")
    assert running.client().get("/status").status_code == 200


def _idle_and_dribbling(running: Running, host: str, port: int) -> None:
    idle = [socket.create_connection((host, port), timeout=60) for _ in range(1100)]
    try:
        with connection(running) as partial, connection(running) as dribbling:
            partial.sendall(b"GET /sta")
            dribbling.sendall(b"GET /status HTTP/1.1\r\n")
            lines = 0
            while True:
                if readable(dribbling, 0.1):
                    assert dribbling.recv(65536) == b""
                    break
                dribbling.sendall(b"x-filler: %d\r\n" % lines)
                lines += 1
                assert lines < 6000, "the dribbling head was never cut off"
            assert closed_by_server(partial)
        for sock in idle:
            assert closed_by_server(sock)
    finally:
        for sock in idle:
            sock.close()


def test_a_head_without_end_is_refused(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """A request head over 64 KiB (endless headers) answers 431 and is closed; memory does
    not grow with what the client keeps sending."""
    running = start_coordinator(janitor, tmp_path, token=TOKEN)
    with connection(running) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\n")
        with contextlib.suppress(OSError):
            for i in range(200):
                sock.sendall(b"x-filler-%d: %s\r\n" % (i, b"y" * 1000))
        status, _ = read_response(sock)
    assert status == 431


def test_connections_past_the_cap_make_room_or_are_refused_and_room_comes_back(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``--max-connections 16``; 2. 17 connections that send nothing: the one that has
    waited longest is closed to make room (no answer), the 16 others stay open;
    3. with those closed, 16 long-polls (whole requests being answered) and one connection
    more: that one is answered 503 naming the limit, and no long-poll is closed;
    4. once those are closed, ``/healthz`` and ``/status`` answer."""
    running = start_coordinator(janitor, tmp_path, "--max-connections", "16",
                                "--read-timeout", "60", "--long-poll-cap", "120", token=TOKEN)
    url = urlsplit(running.url)
    address = (url.hostname, url.port)
    held = [socket.create_connection(address, timeout=60)]
    wait_for(lambda: _server_ends(url.port) == 1 or None, what="the first connection")
    held += [socket.create_connection(address, timeout=60) for _ in range(16)]
    try:
        assert closed_by_server(held[0])
        assert not any(readable(sock, 0.5) for sock in held[1:])
    finally:
        for sock in held:
            sock.close()
    generation = running.status()["generation"]
    polls = [socket.create_connection(address, timeout=120) for _ in range(16)]
    try:
        for sock in polls:
            sock.sendall(head("GET", f"/status?wait=120&since={generation}",
                              f"authorization: Bearer {TOKEN}"))
        wait_for(lambda: (_server_ends(url.port) == 16 and _unread(url.port) == 0) or None,
                 what="16 long-polls read whole")
        with connection(running) as extra:
            status, body = read_response(extra)
        assert status == 503
        assert body is not None
        assert "max_connections" in str(body["detail"])
        assert not any(readable(sock, 0.5) for sock in polls)
    finally:
        for sock in polls:
            sock.close()
    assert wait_for(lambda: _answers(running), what="room for a connection again")


def _server_ends(port: int | None) -> int:
    """The coordinator's established connections on ``port`` (``/proc/net/tcp``)."""
    return sum(1 for local, state, _ in _table() if local == port and state == 1)


def _unread(port: int | None) -> int:
    """Bytes the coordinator has not read yet on its connections on ``port``."""
    return sum(unread for local, state, unread in _table() if local == port and state == 1)


def _table() -> list[tuple[int, int, int]]:
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                rows.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[3], 16),
                             int(fields[4].split(":")[1], 16)))
    return rows


def _answers(running: Running) -> bool | None:
    try:
        with running.client(timeout=5) as client:
            return client.get("/status").status_code == 200 or None
    except httpx.HTTPError:
        return None
