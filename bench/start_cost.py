"""The coordinator's start: CPU from its exec to its first ``/healthz`` answer.

    python -m bench.start_cost [--rounds 7] [--baseline DIR] [-- SERVE_FLAGS...]

Every new pod of a rollout pays this, on the same cores as the engines starting beside it
(docs/benchmarks.md, the rolling update's two controls). Each round starts
``python -m coordinator serve --port 0 --port-file F`` (plus ``SERVE_FLAGS``), polls ``F``
and then ``GET /healthz`` every 2 ms on a socket of its own, and at the first 200 SIGKILLs the
coordinator and takes its CPU time (user + system, every thread) from ``wait4``: what the
kernel charged it from its start to that moment, whatever else the machine ran. The
interpreter alone (``python -c pass`` with the same virtualenv) runs in the same rounds, as
the floor; with ``--baseline DIR`` (a checkout of another commit, with its own ``.venv``)
that tree's coordinator takes its turn too, and the ratios are printed. Medians of
``--rounds``; the bytecode is compiled before the first round (as in an image).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.002


@dataclass
class Side:
    name: str
    tree: Path
    python: str


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def cpu_of(pid: int) -> tuple[float, float]:
    """SIGKILL ``pid`` (our child) and reap it: its (user, system) CPU seconds."""
    os.kill(pid, signal.SIGKILL)
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_utime, usage.ru_stime


def start_once(side: Side, tmp: Path, flags: list[str]) -> tuple[float, float, float]:
    """(CPU s, of it system s, wall s) of one coordinator start to its first /healthz."""
    port_file = tmp / "port.json"
    port_file.unlink(missing_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        [side.python, "-m", "coordinator", "serve", "--port", "0", "--port-file",
         str(port_file), "--log-level", "warning", *flags],
        cwd=side.tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = started + 60
        port = None
        while True:
            if port is None and port_file.exists():
                try:
                    port = int(json.loads(port_file.read_text())["port"])
                except (ValueError, KeyError):
                    port = None  # written but not whole yet
            if port is not None and healthy(port):
                wall = time.monotonic() - started
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{side.name}: the coordinator did not start")
            time.sleep(POLL_S)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    user, system = cpu_of(proc.pid)
    proc.returncode = -signal.SIGKILL  # reaped by wait4
    return user + system, system, wall


def interpreter_once(python: str) -> float:
    """CPU s of ``python -c pass`` (site included): the floor of any Python start."""
    proc = subprocess.Popen([python, "-c", "pass"])
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit with its .venv, started in turn")
    parser.add_argument("flags", nargs="*", help="more `serve` flags (after --)")
    args = parser.parse_args()
    sides = [Side("this tree", ROOT, sys.executable)]
    if args.baseline is not None:
        base = args.baseline.resolve()
        sides.insert(0, Side(f"baseline ({base.name})", base, str(base / ".venv/bin/python")))
    for side in sides:
        compileall.compile_dir(side.tree / "coordinator", quiet=1)
    cpu: dict[str, list[float]] = {s.name: [] for s in sides}
    sys_cpu: dict[str, list[float]] = {s.name: [] for s in sides}
    wall: dict[str, list[float]] = {s.name: [] for s in sides}
    floor: list[float] = []
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for side in sides:  # a first start of each, not timed: the page cache warm for all
            start_once(side, Path(tmp), args.flags)
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            floor.append(interpreter_once(sys.executable))
            for side in sides:
                c, s, w = start_once(side, Path(tmp), args.flags)
                cpu[side.name].append(c)
                sys_cpu[side.name].append(s)
                wall[side.name].append(w)
    print(f"coordinator start to its first /healthz, median of {args.rounds} rounds "
          f"(load average {min(loads):.2f}-{max(loads):.2f})")
    base_floor = statistics.median(floor)
    print(f"  {'python -c pass (the floor)':<30} CPU {base_floor * 1000:6.1f} ms")
    medians = {}
    for side in sides:
        c = statistics.median(cpu[side.name])
        medians[side.name] = c
        print(f"  {side.name:<30} CPU {c * 1000:6.1f} ms (system "
              f"{statistics.median(sys_cpu[side.name]) * 1000:.1f}; rounds "
              f"{min(cpu[side.name]) * 1000:.0f}-{max(cpu[side.name]) * 1000:.0f}), wall "
              f"{statistics.median(wall[side.name]) * 1000:6.1f} ms; x{c / base_floor:.1f} "
              "the floor")
    if len(sides) == 2:
        print(f"  this / baseline: CPU x{medians[sides[1].name] / medians[sides[0].name]:.2f}")


if __name__ == "__main__":
    main()
