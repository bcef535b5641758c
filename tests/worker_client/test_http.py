"""The one transport: answers however they are framed, kept-alive connections, and errors
translated to the package's own."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from worker_client._http import Connection, ResponseReader, translated
from worker_client.errors import CoordinatorUnreachable, ProtocolError

OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
      b'{"id": "w"}')


def _feed(reader: ResponseReader, raw: bytes, step: int) -> bytes:
    """Feed ``raw`` in pieces of ``step`` bytes (split anywhere: head, chunk sizes, body)."""
    return b"".join(reader.feed(raw[i : i + step]) for i in range(0, len(raw), step))


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_answers_framed_by_length_by_chunks_or_by_the_end(step: int) -> None:
    """1. ``Content-Length``: the body, complete, the connection kept.
    2. Chunks: the chunks' bytes joined, complete at the last chunk.
    3. Neither: what came so far, never complete, the connection not kept."""
    reader = ResponseReader()
    assert _feed(reader, OK, step) == b'{"id": "w"}'
    assert (reader.status, reader.complete, reader.keeps_alive) == (200, True, True)

    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"4\r\n{\"a\"\r\n5;x=1\r\n: 1}\n\r\n0\r\n\r\n")
    reader = ResponseReader()
    assert _feed(reader, chunked, step) == b'{"a": 1}\n'
    assert reader.complete

    reader = ResponseReader()
    assert _feed(reader, b"HTTP/1.1 202 Accepted\r\n\r\nsome", step) == b"some"
    assert (reader.status, reader.complete, reader.keeps_alive) == (202, False, False)


def test_errors_below_are_translated_once_with_their_cause() -> None:
    """1. An OSError becomes CoordinatorUnreachable, a ValueError ProtocolError; each keeps
    the original as ``__cause__``."""
    refused = ConnectionRefusedError(111, "refused")
    with pytest.raises(CoordinatorUnreachable) as unreachable, translated("x"):
        raise refused
    assert unreachable.value.__cause__ is refused
    with pytest.raises(ProtocolError) as garbage, translated("x"):
        ResponseReader().feed(b"HTTP/1.1 abc\r\n\r\n")
    assert isinstance(garbage.value.__cause__, ValueError)


@contextlib.contextmanager
def _server(serve: Callable[[socket.socket, int], None]) -> Iterator[str]:
    """A loopback server; ``serve(conn, n)`` answers its n-th connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() does not wake up when another thread closes it
    port = listener.getsockname()[1]
    stop = threading.Event()

    def run() -> None:
        n = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            n += 1
            with conn:
                serve(conn, n)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _recv(conn: socket.socket) -> bytes:
    data = conn.recv(65536)
    if not data:
        raise ConnectionResetError("the client closed the connection")
    return data


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(conn)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += _recv(conn)
    return data


def test_a_kept_alive_connection_closed_meanwhile_is_tried_once_more_on_a_fresh_one() -> None:
    """1. The server answers one request per connection, then closes it.
    2. Three requests on one Connection: each after the first finds its kept connection
    closed, and succeeds on a fresh one (three connections in all).
    3. A coordinator that is not there: CoordinatorUnreachable at once (a fresh connection
    is not retried here)."""
    seen: list[int] = []

    def one_answer(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        seen.append(n)
        conn.sendall(OK)

    with _server(one_answer) as url:
        connection = Connection(url, {"Authorization": "Bearer t"})
        answers = [connection.request("POST", "/workers", {"pid": 1}) for _ in range(3)]
        connection.close()
    assert [(a.status, a.json()) for a in answers] == [(200, {"id": "w"})] * 3
    assert seen == [1, 2, 3]

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(CoordinatorUnreachable):
        Connection(f"http://127.0.0.1:{port}", {}).request("GET", "/")


def test_one_connection_carries_many_requests_when_the_coordinator_keeps_it() -> None:
    """1. The server keeps each connection and answers every request on it.
    2. Five requests: one connection."""
    connections: list[int] = []

    def keep(conn: socket.socket, n: int) -> None:
        connections.append(n)
        with contextlib.suppress(OSError):
            while _read_request(conn):
                conn.sendall(OK)

    with _server(keep) as url:
        connection = Connection(url, {})
        for _ in range(5):
            assert connection.request("GET", "/status").status == 200
        connection.close()
    assert connections == [1]
