"""Every collection a caller can grow has a cap (a 429 naming its setting, nothing half
applied) and an end (what waits too long while serving expires).

Each check runs against a real ``serve`` process with small caps; what it holds is read back
from ``/status`` and ``/metrics``, and the processes' own ends from the OS.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.servers import Running, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "caps-token"


def sleeper(janitor: ProcessJanitor) -> int:
    return janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM).pid


def refused(response: httpx.Response, limit: str) -> None:
    """``response`` is the 429 of ``limit``: it says which setting, and when to retry."""
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["limit"] == limit
    assert "--" + limit.replace("_", "-") in body["detail"]
    assert response.headers["retry-after"] == "1"
    assert response.headers["x-limit"] == limit


def refusals(running: Running, limit: str) -> float:
    """``shutdown_coordinator_limit_refusals_total{limit=…}`` from ``/metrics``."""
    return metric(running, f'shutdown_coordinator_limit_refusals_total{{limit="{limit}"}}')


def metric(running: Running, name: str) -> float:
    text = httpx.get(running.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_workers_past_the_cap_are_refused(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. ``--max-workers 2``; 2. two processes register (201); 3. a third is refused 429
    naming ``--max-workers``, and is not listed; 4. the first registering again is no new
    worker (200, same id)."""
    running = start_coordinator(janitor, tmp_path, "--max-workers", "2", token=TOKEN)
    pids = [sleeper(janitor) for _ in range(3)]
    first = register(running, pids[0])
    register(running, pids[1])
    with running.client() as client:
        refused(client.post("/workers", json={"pid": pids[2]}), "max_workers")
        again = client.post("/workers", json={"pid": pids[0]})
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert sorted(w["pid"] for w in running.status()["workers"]) == sorted(pids[:2])
    assert refusals(running, "max_workers") == 1


def test_a_report_past_the_handoff_cap_is_refused_whole(janitor: ProcessJanitor,
                                                        tmp_path: Path) -> None:
    """1. ``--max-handoffs 5``; 2. a report of 3 handoffs is taken; 3. one of 3 more is
    refused 429 and none of its handoffs is listed; 4. an engine-migrated handoff (never
    pending) still fits; 5. once a router acknowledged one, the 3 more fit."""
    running = start_coordinator(janitor, tmp_path, "--max-handoffs", "5", token=TOKEN)
    worker = register(running, sleeper(janitor))["id"]

    def report(*ids: str, ack: str = "router") -> httpx.Response:
        with running.client() as client:
            return client.post(f"/workers/{worker}/report", json={
                "handoffs": [{"request_id": i, "tokens": 1, "ack": ack} for i in ids]})

    assert report("a", "b", "c").status_code == 200
    refused(report("d", "e", "f"), "max_handoffs")
    status = running.status()
    assert sorted(m["request_id"] for m in status["migrations"]) == ["a", "b", "c"]
    assert status["migration_counts"]["handed_back"] == 3
    assert report("x", ack="engine").status_code == 200
    with running.client() as client:
        assert client.post("/migrations/ack", json={"request_ids": ["a"]}).json()["acked"] == \
            ["a"]
    assert report("d", "e", "f").status_code == 200
    status = running.status()
    assert sorted(m["request_id"] for m in status["migrations"]) == ["b", "c", "d", "e", "f"]
    assert status["migration_counts"]["handed_back"] == 7


def test_early_acknowledgements_past_the_cap_are_refused(janitor: ProcessJanitor,
                                                         tmp_path: Path) -> None:
    """1. ``--max-early-acks 3``; 2. three acknowledgements of unreported handoffs are kept;
    3. two more are refused 429, nothing kept of them; 4. repeating a kept one is no new
    one."""
    running = start_coordinator(janitor, tmp_path, "--max-early-acks", "3", token=TOKEN)
    with running.client() as client:
        assert client.post("/migrations/ack", json={"request_ids": ["a", "b", "c"]}
                           ).json()["early"] == ["a", "b", "c"]
        refused(client.post("/migrations/ack", json={"request_ids": ["d", "e"]}),
                "max_early_acks")
        assert client.post("/migrations/ack", json={"request_ids": ["a"]}
                           ).json()["early"] == ["a"]
    assert running.status()["migration_counts"]["early_acks"] == 3


@pytest.mark.parametrize("extra", ["", "&view=router&x=1"],
                         ids=["fast path", "framework route"])
def test_long_polls_past_the_cap_are_refused(janitor: ProcessJanitor, tmp_path: Path,
                                             extra: str) -> None:
    """1. ``--max-long-polls 1``; 2. one caller waits on ``/status?wait=600&since=G``;
    3. another waiting caller is refused 429 (through the fast path, and through the
    framework's route for a query the fast path leaves to it); a plain ``/status`` still
    answers; 4. a change wakes the first, and a new long-poll is taken again."""
    running = start_coordinator(janitor, tmp_path, "--max-long-polls", "1", token=TOKEN)
    answers: list[httpx.Response] = []
    stop = threading.Event()

    def hold() -> None:
        # Each poll waits on the generation current when it starts; one the coordinator's
        # own start-up changes answers at once, and the next one waits.
        with running.client(timeout=600) as client:
            while not stop.is_set():
                generation = client.get("/status").json()["generation"]
                answer = client.get(f"/status?wait=600&since={generation}")
                if answer.status_code != 429:  # the other caller's poll held the one place
                    answers.append(answer)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        def second() -> httpx.Response | None:
            with running.client() as client:
                generation = client.get("/status").json()["generation"]
                answer = client.get(f"/status?wait=0.2&since={generation}{extra}")
            return answer if answer.status_code == 429 else None

        refused(wait_for(second, what="the second long-poll refused"), "max_long_polls")
        with running.client() as client:
            assert client.get("/status").status_code == 200
    finally:
        stop.set()
        register(running, sleeper(janitor))  # a change: the held poll answers
        holder.join(timeout=60)
    assert not holder.is_alive()
    assert answers
    assert all(a.status_code == 200 for a in answers)
    with running.client() as client:
        generation = client.get("/status").json()["generation"]
        assert client.get(f"/status?wait=0.1&since={generation}{extra}").status_code == 200
    assert refusals(running, "max_long_polls") >= 1


def test_what_waits_too_long_while_serving_expires(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """1. ``--expire-after 0.5``; 2. two handoffs are reported and one unknown id is
    acknowledged early; 3. both handoffs expire (counted ``expired``, in ``/status`` and the
    metrics) and the early acknowledgement is dropped; 4. nothing of that makes a later drain
    lose a request: no drain ran."""
    running = start_coordinator(janitor, tmp_path, "--expire-after", "0.5", token=TOKEN)
    worker = register(running, sleeper(janitor))["id"]
    with running.client() as client:
        assert client.post(f"/workers/{worker}/report", json={"handoffs": [
            {"request_id": "a", "tokens": 1}, {"request_id": "b", "tokens": 2}]}
        ).status_code == 200
        assert client.post("/migrations/ack", json={"request_ids": ["z"]}).json()["early"] \
            == ["z"]

    def expired() -> dict[str, Any] | None:
        status = running.status()
        counts = status["migration_counts"]
        return status if counts["pending"] == 0 and counts["early_acks"] == 0 else None

    status = wait_for(expired, what="the handoffs and the early ack to expire")
    assert status["migration_counts"]["expired"] == 2
    assert status["migrations"] == []
    assert status["phase"] == "serving"
    assert status["last_drain"] is None
    assert metric(running, 'shutdown_coordinator_migrations_total{event="expired"}') == 2


def test_an_exited_worker_is_forgotten_once_nothing_it_started_runs(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``--expire-after 0.5``; a worker (a shell in its own session) starts a child and is
    registered; 2. the shell is SIGKILLed (its wait status says so): the worker is exited,
    and its child, reparented, is still listed under it; 3. long past the expiry it is still
    listed, since its child runs; 4. once the child is ended (its wait status read by its new
    parent is not ours to see: /proc says it is gone), the worker is forgotten."""
    running = start_coordinator(janitor, tmp_path, "--expire-after", "0.5",
                                "--scan-interval", "0.2", token=TOKEN)
    ready = tmp_path / "child.pid"
    shell = janitor.spawn(["bash", "-c", f"sleep 600 & echo $! > {ready}.tmp; "
                           f"mv {ready}.tmp {ready}; wait"])
    child = int(wait_for(lambda: ready.exists() and ready.read_text().strip(),
                         what="the child's pid"))
    janitor.adopt(child)
    worker = register(running, shell.pid)["id"]
    wait_for(lambda: any(p["pid"] == child for p in running.status()["processes"]),
             what="the child listed")
    shell.send_signal(signal.SIGKILL)
    assert shell.wait(timeout=60) == -signal.SIGKILL

    def exited_with_child() -> bool:
        status = running.status()
        mine = [w for w in status["workers"] if w["id"] == worker]
        return bool(mine) and mine[0]["state"] == "exited" and any(
            p["pid"] == child and p["root_pid"] == shell.pid for p in status["processes"])

    wait_for(exited_with_child, what="the worker exited, its child still listed under it")
    # Past the expiry four times over (a sweep runs every 0.125 s), it is kept: its child
    # runs.
    exited_at = next(w["exited_at"] for w in running.status()["workers"] if w["id"] == worker)
    wait_for(lambda: time.time() > exited_at + 2.0, what="the expiry long past")
    assert exited_with_child()
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child),
             what="the child gone")
    wait_for(lambda: all(w["id"] != worker for w in running.status()["workers"]),
             what="the exited worker forgotten")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def open_stream(running: Running, worker_id: str) -> tuple[socket.socket, bytes]:
    """Open ``/workers/{id}/events`` on a plain socket, as ``worker_client`` does; returns the
    socket and what arrived up to the end of the first line after the head (the ``hello``,
    or a whole refusal)."""
    host, port = running.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"GET /workers/{worker_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                 f"Authorization: Bearer {TOKEN}\r\nAccept: application/x-ndjson\r\n\r\n"
                 .encode())
    got = b""
    while not _whole(got):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return sock, got


def _whole(got: bytes) -> bool:
    """The head and the ``hello`` line of a stream, or the head and the body of a refusal
    (its ``content-length``): both may come in more than one segment."""
    head, sep, body = got.partition(b"\r\n\r\n")
    if not sep:
        return False
    if b" 200 " in head.split(b"\r\n", 1)[0]:
        return b'"hello"' in body and body.rstrip().endswith(b"}")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return length is not None and len(body) >= int(length.group(1))


def still_open(sock: socket.socket) -> bool:
    """Nothing to read and no end of stream: the coordinator holds the stream open."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) != b""
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def test_event_streams_past_the_cap_are_refused_and_those_held_stay_open(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. ``--max-streams-per-worker 2``; 2. a worker opens two event streams on plain
    sockets: each gets its ``hello`` and stays open, and ``/status`` says it is connected;
    3. a third is refused 429 naming the setting; 4. one closed, a new one is taken; 5. a
    drain reaches both open streams."""
    running = start_coordinator(janitor, tmp_path, "--max-streams-per-worker", "2",
                                token=TOKEN)
    worker_id = str(register(running, sleeper(janitor))["id"])
    held = [open_stream(running, worker_id) for _ in range(2)]
    socks = [sock for sock, _ in held]
    try:
        for _, got in held:
            assert got.startswith(b"HTTP/1.1 200 "), got
            assert b'"type":"hello"' in got, got
        wait_for(lambda: running.status()["workers"][0]["connected"] or None,
                 what="the worker connected")
        assert all(still_open(sock) for sock in socks)
        third, got = open_stream(running, worker_id)
        third.close()
        assert got.startswith(b"HTTP/1.1 429 "), got
        assert b"--max-streams-per-worker" in got
        assert b"x-limit: max_streams_per_worker" in got
        assert refusals(running, "max_streams_per_worker") == 1
        socks.pop().close()

        def taken() -> socket.socket | None:
            sock, got = open_stream(running, worker_id)
            if got.startswith(b"HTTP/1.1 200 "):
                return sock
            sock.close()  # the coordinator has not yet seen the close
            return None

        socks.append(wait_for(taken, what="a stream taken after one closed"))
        assert all(still_open(sock) for sock in socks)
        with running.client() as client:
            assert client.post("/drain", json={"wait": False}).status_code in (200, 202)
        for sock in socks:
            sock.settimeout(60)
            seen = b""
            while b'"type":"drain"' not in seen:
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
    finally:
        for sock in socks:
            sock.close()
