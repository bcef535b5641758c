"""Benchmark of ``GET /status``, its long-poll and the drain push, on loopback.

    .venv/bin/python bench/status.py [--seconds 5] [--rounds 60]

Sets up 16 registered workers whose trees hold 500 processes in all, then measures:

1. ``/status`` requests per second, plain and with ``If-None-Match`` (304), against the same
   coordinator with the per-generation cache turned off (the baseline, same run);
2. long-poll wake-up: 16 ``/status?wait=30&since=G`` pollers, time from the drain's start (its
   ``started_at``, taken by the server when the phase changes) to each poller's first byte
   (its wake-up), and to its whole answer read (wake-up plus moving 16 documents of ~90 KB);
   the same with ``view=router`` (what routers poll: no process list, a few KB);
3. drain push: 16 held-open worker event streams, time from the drain's start to each
   stream's ``drain`` line read (timed in other rounds than 2, so the one client core is not
   busy reading status documents meanwhile).

Both are wall-clock differences on one machine, and include the client's own reading.
4. the coordinator's RSS after all of it.

The coordinator is pinned to CPU 0 and this load generator (raw asyncio sockets, keep-alive) to
CPU 1. Every process this script starts is ended by it, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 16
PROCESSES = 500
SERVER_CPU = 0
CLIENT_CPU = 1


# --- setup --------------------------------------------------------------------------------


def start_trees() -> list[subprocess.Popen[bytes]]:
    """16 shell roots with sleeping children, 500 processes in all."""
    roots: list[subprocess.Popen[bytes]] = []
    for i in range(WORKERS):
        children = PROCESSES // WORKERS - 1 + (1 if i < PROCESSES % WORKERS else 0)
        script = "sleep 1000 & " * children + "wait"
        roots.append(subprocess.Popen(["sh", "-c", script], start_new_session=True))
    return roots


def start_coordinator(tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"port-{len(list(tmp.iterdir()))}.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "serve", "--port", "0", "--port-file",
         str(port_file), "--log-level", "warning", "--grace-period", "120",
         "--scan-interval", "3600", *extra],
        cwd=ROOT, start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {SERVER_CPU}))
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("coordinator did not start")
        time.sleep(0.05)
    url = str(json.loads(port_file.read_text())["url"])
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)


def register_all(url: str, roots: list[subprocess.Popen[bytes]]) -> list[str]:
    ids = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for root in roots:
            ids.append(client.post("/workers", json={"pid": root.pid}).json()["id"])
        deadline = time.monotonic() + 60
        while len(client.get("/status").json()["processes"]) < PROCESSES:
            if time.monotonic() > deadline:
                raise SystemExit("the coordinator never listed 500 processes")
            time.sleep(0.1)
    return ids


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End one process this script started, and its descendants, by PID."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    proc.wait()


# --- raw HTTP/1.1 over asyncio sockets ----------------------------------------------------


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


def request(path: str, host: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


async def hammer(url: str, seconds: float, connections: int, etag: bool,
                 path: str = "/status") -> float:
    """Requests per second of GET ``path`` over ``connections`` keep-alive sockets."""
    host, port = url.removeprefix("http://").split(":")
    async with httpx.AsyncClient() as client:
        first = await client.get(url + path)
    header = f"If-None-Match: {first.headers['etag']}\r\n" if etag else ""
    expected = 304 if etag else 200
    raw = request(path, host, header)
    count = 0
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal count
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.monotonic() < stop_at:
            writer.write(raw)
            status, _, _ = await read_response(reader)
            if status != expected:
                raise SystemExit(f"unexpected status {status}")
            count += 1
        writer.close()

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(connections)))
    return count / (time.monotonic() - started)


async def wakeups(url: str, worker_ids: list[str], rounds: int) -> dict[str, list[float]]:
    """Samples (ms) over ``rounds`` drain/abort cycles: long-poll first byte and whole answer
    read, for the full document and for the router view, and the drain push."""
    host, port = url.removeprefix("http://").split(":")
    client = httpx.AsyncClient(base_url=url, timeout=30)
    # Hold the drain in migrating so DELETE /drain can end each round.
    await client.post(f"/workers/{worker_ids[0]}/report", json={"inflight": 1})
    streams = []
    for worker_id in worker_ids:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request(f"/workers/{worker_id}/events", host))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readline()  # chunk size
        await reader.readline()  # hello
        streams.append((reader, writer))
    pollers = [await asyncio.open_connection(host, int(port)) for _ in range(WORKERS)]
    control_r, control_w = await asyncio.open_connection(host, int(port))
    payload = b'{"wait": false}'
    drain_request = (f"POST /drain HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    samples: dict[str, list[float]] = {key: [] for key in (
        "poll_full", "read_full", "poll_router", "read_router", "push")}

    async def drain_line(reader: asyncio.StreamReader) -> float:
        while True:
            line = await reader.readline()
            if b'"type":"drain"' in line:
                arrived = time.time()
                return (arrived - float(json.loads(line)["started_at"])) * 1000

    async def poll(reader: asyncio.StreamReader) -> tuple[float, float]:
        head = await reader.readuntil(b"\r\n\r\n")
        woke = time.time()
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
        read = time.time()
        started = float(json.loads(body)["drain"]["started_at"])
        return (woke - started) * 1000, (read - started) * 1000

    for round_no in range(rounds):
        # Rounds take turns: full-document pollers, router-view pollers, the streams; one
        # client core reading 16 answers would otherwise delay the stream reads it is timing.
        view = ("full", "router", None)[round_no % 3]
        timing_polls = view is not None
        generation = (await client.get("/status")).json()["generation"]
        if timing_polls:
            for _, writer in pollers:
                writer.write(request(f"/status?view={view}&wait=30&since={generation}", host))
            await asyncio.sleep(0.05)  # let every poller reach the server's wait
        push = [asyncio.ensure_future(drain_line(r)) for r, _ in streams]
        polled = [asyncio.ensure_future(poll(r)) for r, _ in pollers] if timing_polls else []
        # A raw request whose answer is read only afterwards, so nothing on this side
        # competes with the reads being timed.
        control_w.write(drain_request)
        if timing_polls:
            for woke, read in await asyncio.gather(*polled):
                samples[f"poll_{view}"].append(woke)
                samples[f"read_{view}"].append(read)
            await asyncio.gather(*push)
        else:
            samples["push"].extend(await asyncio.gather(*push))
        await read_response(control_r)
        await client.delete("/drain")
        await asyncio.sleep(0.02)
    for _, writer in [*streams, *pollers, (control_r, control_w)]:
        writer.close()
    await client.aclose()
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=60, help="drain/abort rounds")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CPU})
    roots = start_trees()
    servers: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            cached, url = start_coordinator(tmp)
            servers.append(cached)
            ids = register_all(url, roots)
            results["status_bytes"] = len(httpx.get(url + "/status").content)
            results["router_bytes"] = len(httpx.get(url + "/status?view=router").content)
            results["plain"] = asyncio.run(hammer(url, args.seconds, args.connections, False))
            results["etag"] = asyncio.run(hammer(url, args.seconds, args.connections, True))
            results["router"] = asyncio.run(hammer(url, args.seconds, args.connections, False,
                                                   "/status?view=router"))
            samples = asyncio.run(wakeups(url, ids, args.rounds))
            results["rss_mb"] = psutil.Process(cached.pid).memory_info().rss / 2**20
            stop(cached)
            servers.remove(cached)

            uncached, url = start_coordinator(tmp, "--no-status-cache")
            servers.append(uncached)
            register_all(url, roots)
            results["baseline"] = asyncio.run(hammer(url, args.seconds, args.connections,
                                                     False))
    finally:
        for proc in [*servers, *roots]:
            stop(proc)
    print(f"/status document: {results['status_bytes']} bytes (router view "
          f"{results['router_bytes']} bytes), {WORKERS} workers, {PROCESSES} processes; "
          f"server on CPU {SERVER_CPU}, load on CPU {CLIENT_CPU}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'measure':<44}{'value':>12}")
    print(f"{'GET /status, cached per generation (req/s)':<44}{results['plain']:>12.0f}")
    print(f"{'GET /status, If-None-Match -> 304 (req/s)':<44}{results['etag']:>12.0f}")
    print(f"{'GET /status?view=router (req/s)':<44}{results['router']:>12.0f}")
    print(f"{'GET /status, no cache (baseline, req/s)':<44}{results['baseline']:>12.0f}")
    print(f"{'cached / baseline':<44}{results['plain'] / results['baseline']:>11.1f}x")
    print(f"{'304 / baseline':<44}{results['etag'] / results['baseline']:>11.1f}x")
    for name, key in (("long-poll full, first byte", "poll_full"),
                      ("long-poll full, whole answer read", "read_full"),
                      ("long-poll router view, first byte", "poll_router"),
                      ("long-poll router view, whole answer", "read_router"),
                      ("drain push to stream", "push")):
        got = samples[key]
        print(f"{name + ' p50/p99/max ms':<52}"
              f"{pct(got, 0.5):>5.2f} / {pct(got, 0.99):.2f} / {max(got):.2f}  (n={len(got)})")
    print(f"{'coordinator RSS (MB)':<44}{results['rss_mb']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
