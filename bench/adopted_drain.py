"""The drain's own cost for an adopted engine: a tree of N processes, each with a cleanup.

    python -m bench.adopted_drain [--processes 300] [--cleanup-s 0.3] [--rounds 5]
                                  [--baseline DIR]

An engine that never registers is adopted by its command line (``--adopt-pattern``): a root
(a lean ``python -S`` with a marker in its command line) and N - 1 children, as an engine's
schedulers and workers are. Each child waits for SIGTERM, then spends ``--cleanup-s`` on its
cleanup and exits 0; the root exits 0 at its SIGTERM (it is signalled last, its children
gone). Each round starts a fresh tree and a fresh coordinator adopting it, waits until
``/status`` lists all N processes, then times ``GET /drain`` (the kubelet's preStop call)
from the request to the whole summary read. The coordinator runs as the shipped manifests
run it: a state file (written at every change, so a restarted coordinator resumes the drain),
the default log level (a line per process, into a pipe to ``/dev/null``). The summary must
say ``graceful`` with every process ``exited``, and every child must have exited 0 as its
root saw it (``waitpid``).

Printed per round and as medians: the round trip, the time beyond the cleanup (the round trip
less ``--cleanup-s``: what the drain itself adds), and the CPU the coordinator spent between
the request and the answer (``/proc/<pid>/stat``, its threads included), the figure a busy
machine disturbs least. With ``--baseline DIR`` (a checkout of another commit with its own
``.venv``), its coordinator takes every other round, in turn with this one's, and the ratios
are printed. Every process the bench starts is ended by it, by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

TREE = r"""
import ctypes, os, signal, struct, sys, time
n, cleanup_s, out_fd = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
kids = []
for _ in range(n - 1):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_fd)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG, as engines' children
            signal.sigwait({signal.SIGTERM})
            time.sleep(cleanup_s)
            os._exit(0)
        finally:
            os._exit(1)
    kids.append(pid)
sys.stdout.write(" ".join(map(str, kids)) + "\n")
sys.stdout.flush()
statuses = []
for _ in kids:
    statuses.append(os.wait())
os.write(out_fd, struct.pack(f"={2 * len(statuses)}i", *(x for s in statuses for x in s)))
os.close(out_fd)
signal.sigwait({signal.SIGTERM})
os._exit(0)
"""
"""Runs as ``python -S -c TREE N CLEANUP_S OUT_FD MARKER``: forks the children, reaps them,
writes their wait statuses to ``OUT_FD``, then exits 0 at its own SIGTERM."""


@dataclass
class Tree:
    root: subprocess.Popen[bytes]
    children: list[int]
    read_fd: int
    marker: str

    def statuses(self) -> dict[int, int]:
        """Each child's wait status as the root reaped it (after the drain)."""
        data = b""
        while chunk := os.read(self.read_fd, 65536):
            data += chunk
        values = list(memoryview(data).cast("i"))
        return dict(zip(values[0::2], values[1::2], strict=True))


def start_tree(n: int, cleanup_s: float) -> Tree:
    marker = f"adopted-bench-{uuid.uuid4().hex[:12]}"
    read_fd, write_fd = os.pipe()
    root = subprocess.Popen(
        [sys.executable, "-S", "-c", TREE, str(n), str(cleanup_s), str(write_fd), marker],
        stdout=subprocess.PIPE, pass_fds=[write_fd], start_new_session=True)
    os.close(write_fd)
    assert root.stdout is not None
    children = [int(pid) for pid in root.stdout.readline().split()]
    return Tree(root, children, read_fd, marker)


def end_tree(tree: Tree) -> None:
    """SIGKILL the root (its children die with it: PR_SET_PDEATHSIG), reap it."""
    with contextlib.suppress(ProcessLookupError):
        tree.root.send_signal(signal.SIGKILL)
    tree.root.wait()
    os.close(tree.read_fd)


@dataclass
class Side:
    name: str
    tree_dir: Path
    python: str


def start_coordinator(side: Side, tmp: Path, marker: str) -> tuple[subprocess.Popen[bytes], str]:
    run = uuid.uuid4().hex[:8]
    port_file = tmp / f"port-{run}.json"
    proc = subprocess.Popen(
        [side.python, "-m", "coordinator", "serve", "--port", "0", "--port-file",
         str(port_file), "--grace-period", "30", "--scan-interval", "3600",
         "--state-file", str(tmp / f"state-{run}.json"), "--adopt-pattern", marker],
        cwd=side.tree_dir, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            stop(proc)
            raise SystemExit(f"{side.name}: the coordinator did not start")
        time.sleep(0.02)
    url = str(json.loads(port_file.read_text())["url"])
    return proc, url


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def get(url: str, path: str, timeout_s: float = 120) -> tuple[int, dict[str, Any]]:
    """A plain HTTP/1.1 GET on a socket of its own: nothing in the timed path but the call."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out = b""
        while body:
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, body = out + body[:size], body[size + 2:]
        body = out
    return status, json.loads(body) if body else {}


def cpu_s(pid: int) -> float:
    """utime + stime of a process, its threads included."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Round:
    round_trip_ms: float
    beyond_ms: float
    cpu_ms: float


def one_round(side: Side, tmp: Path, n: int, cleanup_s: float) -> Round:
    tree = start_tree(n, cleanup_s)
    coordinator = None
    try:
        coordinator, url = start_coordinator(side, tmp, tree.marker)
        deadline = time.monotonic() + 60
        while True:
            status, doc = get(url, "/status")
            listed = {p["pid"] for p in doc.get("processes", [])}
            if status == 200 and listed >= {tree.root.pid, *tree.children}:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{side.name}: the coordinator never listed the tree")
            time.sleep(0.05)
        cpu0 = cpu_s(coordinator.pid)
        started = time.monotonic()
        status, summary = get(url, "/drain")
        elapsed = time.monotonic() - started
        cpu = cpu_s(coordinator.pid) - cpu0
        check(side, tree, status, summary, n)
    finally:
        if coordinator is not None:
            stop(coordinator)
        end_tree(tree)
    return Round(elapsed * 1000, (elapsed - cleanup_s) * 1000, cpu * 1000)


def check(side: Side, tree: Tree, status: int, summary: dict[str, Any], n: int) -> None:
    """The drain was graceful, and every child exited 0 as its parent saw it."""
    fates = {p["pid"]: p["fate"] for p in summary.get("processes", [])}
    problems = []
    if status != 200 or summary.get("outcome") != "graceful":
        problems.append(f"status {status}, outcome {summary.get('outcome')}")
    if len(fates) != n or set(fates.values()) != {"exited"}:
        problems.append(f"{len(fates)} processes, fates {sorted(set(fates.values()))}")
    if tree.root.wait(timeout=10) != 0:
        problems.append(f"the root exited {tree.root.returncode}")
    statuses = tree.statuses()
    bad = [pid for pid in tree.children if statuses.get(pid) != 0]
    if bad:
        problems.append(f"{len(bad)} children did not exit 0")
    if problems:
        raise SystemExit(f"{side.name}: " + "; ".join(problems))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--cleanup-s", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit, with its .venv, run in turn")
    args = parser.parse_args()
    sides = [Side("this tree", ROOT, sys.executable)]
    if args.baseline is not None:
        base = args.baseline.resolve()
        sides.insert(0, Side(f"baseline ({base.name})", base, str(base / ".venv/bin/python")))
    results: dict[str, list[Round]] = {s.name: [] for s in sides}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for side in sides:
                loads.append(os.getloadavg()[0])
                r = one_round(side, Path(tmp), args.processes, args.cleanup_s)
                results[side.name].append(r)
                print(f"  {side.name:<28} round trip {r.round_trip_ms:7.1f} ms, beyond the "
                      f"cleanup {r.beyond_ms:6.1f} ms, coordinator CPU {r.cpu_ms:6.1f} ms",
                      flush=True)
    print(f"\nGET /drain of {args.processes} adopted processes, {args.cleanup_s:g} s cleanup "
          f"each; median of {args.rounds} rounds (load average {min(loads):.2f}-"
          f"{max(loads):.2f})")
    medians = {name: Round(*(statistics.median(getattr(r, f) for r in rounds)
                             for f in ("round_trip_ms", "beyond_ms", "cpu_ms")))
               for name, rounds in results.items()}
    for name, m in medians.items():
        print(f"  {name:<28} round trip {m.round_trip_ms:7.1f} ms, beyond the cleanup "
              f"{m.beyond_ms:6.1f} ms, coordinator CPU {m.cpu_ms:6.1f} ms")
    if len(sides) == 2:
        base, this = medians[sides[0].name], medians[sides[1].name]
        print(f"  this / baseline: beyond the cleanup x{this.beyond_ms / base.beyond_ms:.2f}, "
              f"CPU x{this.cpu_ms / base.cpu_ms:.2f}")


if __name__ == "__main__":
    main()
