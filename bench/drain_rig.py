"""What both drain benchmarks (``bench/drain.py``) use: the reference router over the pods,
a drain call sent on a raw socket, percentiles."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.sim.launcher import EngineHandle
from tests.service.servers import Running
from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[1]
NO_COORDINATOR = "http://127.0.0.1:9"


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_router(janitor: ProcessJanitor, tmp: Path, pod_a: list[EngineHandle],
                 coord_a: Running | None, pod_b: list[EngineHandle], coord_b: Running,
                 resume: str) -> str:
    """The reference router over pod A's engines (watching ``coord_a``) and pod B's standby
    engines, continuing or restarting handed-back requests as ``resume`` says; its URL."""
    ready = tmp / "router.json"
    argv = ["-m", "devstack.reference_router", "--port", "0", "--ready-file", str(ready),
            "--resume", resume]
    for e in pod_a:
        argv += ["--worker", f"{e.url}={coord_a.url if coord_a else NO_COORDINATOR}"]
    for e in pod_b:
        argv += ["--standby-worker", f"{e.url}={coord_b.url}"]
    janitor.spawn_python(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    wait_for(ready.exists, what="router ready")
    return str(json.loads(ready.read_text())["url"])


def slice_note(args: argparse.Namespace) -> str:
    """How the engines' loops were scheduled around the notice, for the report's first line."""
    us = args.latency_slice_us
    if us is None:
        return "; engines' loops: the default (a 100 us slice from the doorbell's ring)"
    if us == 0:
        return "; engines' loops: scheduling left alone (latency_slice_us=0)"
    return f"; engines' loops: a {us} us slice for good + yield at the doorbell"


def urlsplit_hostport(url: str) -> tuple[str, int]:
    """(host, port) of ``url``, for a socket opened ahead of a timed call."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def read_answer(sock: socket.socket) -> dict[str, Any]:
    """The JSON body of a ``Connection: close`` HTTP/1.1 answer (chunked or not)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    answer: dict[str, Any] = json.loads(body)
    return answer
