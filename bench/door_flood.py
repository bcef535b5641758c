"""The door under a reconnecting connection flood: are the kubelet's probes and its drain
answered, and how fast?

    .venv/bin/python -m bench.door_flood [--max-connections 200] [--flood 400]
        [--seconds 20] [--code DIR] [--peer-lookups 200 --idle 8000]

1. A coordinator (``serve`` without a token, on loopback) is started from ``--code`` (a
   checkout: compare two versions of the coordinator in one run, e.g. ``git archive main``);
2. a flood process holds ``--flood`` connections that send nothing, each opened again the
   moment the coordinator closes it (refused, timed out or evicted);
3. for ``--seconds`` a kubelet-shaped client probes ``/healthz`` and ``/readyz`` in turn,
   each on a fresh connection every 0.2 s (a probe answered within 5 s counts, like the
   kubelet's ``timeoutSeconds``), then sends ``GET /drain`` (nothing is registered: it
   answers at once with ``nothing_to_drain``);
4. what was answered, the answer times (p50, p90, max), the failures by kind, and the
   coordinator's resident memory before and after the flood are printed.

``--peer-lookups N --idle M`` measures instead the CPU time (of the coordinator, from
``/proc/<pid>/stat``) of N unauthenticated registrations while M idle loopback connections
exist on the host (any local user can open them): the caller is looked up per connection.
Every process the bench starts is ended by it, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBE_EVERY_S = 0.2
PROBE_TIMEOUT_S = 5.0
FLOOD = r"""
import asyncio, resource, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
opened = 0
async def hold():
    global opened
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            opened += 1
            await reader.read(65536)  # returns at the coordinator's close (or its answer)
            writer.close()
        except OSError:
            await asyncio.sleep(0.001)
async def main():
    await asyncio.gather(*(hold() for _ in range(count)))
asyncio.run(main())
"""


def start_coordinator(code: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(tempfile.mkdtemp(prefix="door-")) / "port.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "serve", "--port", "0", "--port-file",
         str(port_file), "--log-level", "error", "--doorbell", "off", *args],
        cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the coordinator did not start (exit {proc.poll()})")
        time.sleep(0.05)
    time.sleep(0.2)
    return proc, int(json.loads(port_file.read_text())["port"])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ask(port: int, path: str, timeout_s: float) -> tuple[int | str, float]:
    """One request on a fresh connection: (status, or why none came; seconds taken)."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(max(0.01, timeout_s - (time.monotonic() - started)))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: "
                         "kube-probe/1.31\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    return "closed", time.monotonic() - started
                data += chunk
            return int(data.split(b" ", 2)[1]), time.monotonic() - started
    except TimeoutError:
        return "timeout", time.monotonic() - started
    except OSError as exc:
        return type(exc).__name__, time.monotonic() - started


def flood_run(code: Path, max_connections: int | None, flood: int, seconds: float,
              ) -> dict[str, Any]:
    args = [] if max_connections is None else ["--max-connections", str(max_connections)]
    coordinator, port = start_coordinator(code, *args)
    flooder: subprocess.Popen[bytes] | None = None
    try:
        rss_before = rss_mib(coordinator.pid)
        flooder = subprocess.Popen([sys.executable, "-c", FLOOD, "127.0.0.1", str(port),
                                    str(flood)], start_new_session=True)
        time.sleep(2.0)  # the flood at its full strength before the first probe
        answers: list[float] = []
        failures: Counter[str] = Counter()
        probes = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            path = "/healthz" if probes % 2 == 0 else "/readyz"
            probes += 1
            status, took = ask(port, path, PROBE_TIMEOUT_S)
            if status == 200:
                answers.append(took)
            else:
                failures[str(status)] += 1
            time.sleep(max(0.0, PROBE_EVERY_S - took))
        drain_status, drain_s = ask(port, "/drain", 30.0)
        rss_flood = rss_mib(coordinator.pid)
        return {"max_connections": max_connections or 8192, "flood": flood,
                "probes": probes, "answered": len(answers), "failures": dict(failures),
                "p50_ms": _ms(answers, 50), "p90_ms": _ms(answers, 90),
                "max_ms": round(max(answers) * 1000, 1) if answers else None,
                "drain": drain_status, "drain_s": round(drain_s, 3),
                "rss_mib": [round(rss_before, 1), round(rss_flood, 1)]}
    finally:
        for proc in (flooder, coordinator):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def peer_run(code: Path, lookups: int, idle: int) -> dict[str, Any]:
    coordinator, port = start_coordinator(code)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    held: list[socket.socket] = []
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        for _ in range(idle // 2):  # each connection is two sockets in the table
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            held += [client, server]
        body = json.dumps({"pid": sleeper.pid}).encode()
        request = (f"POST /workers HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close"
                   "\r\n\r\n").encode() + body
        before = cpu_s(coordinator.pid)
        for _ in range(lookups):
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                sock.sendall(request)
                while sock.recv(65536):
                    pass
        spent = cpu_s(coordinator.pid) - before
        return {"idle_sockets": len(held), "registrations": lookups,
                "coordinator_cpu_ms_each": round(spent / lookups * 1000, 2)}
    finally:
        for sock in held:
            sock.close()
        listener.close()
        for proc in (sleeper, coordinator):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def _ms(values: list[float], percentile: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0] * 1000, 1)
    return round(statistics.quantiles(values, n=100)[percentile - 1] * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="the checkout whose coordinator runs (default: this one)")
    parser.add_argument("--max-connections", type=int, default=None)
    parser.add_argument("--flood", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--peer-lookups", type=int, default=0)
    parser.add_argument("--idle", type=int, default=8000)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    if args.peer_lookups:
        result = peer_run(args.code, args.peer_lookups, args.idle)
    else:
        result = flood_run(args.code, args.max_connections, args.flood, args.seconds)
    print(json.dumps({"code": str(args.code), "load": load, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
