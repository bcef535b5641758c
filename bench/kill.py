"""Exit detection of the kill engine against psutil polling and ``psutil.wait_procs``.

    python -m bench.kill [--sizes 10,100,500] [--spread-ms 300] [--repeats 3] [--idle-s 3]
                         [--baseline DIR]

For each size N, N children are forked from this process (no new interpreter each: cheap
enough for 500). Each blocks SIGTERM and waits for it; on SIGTERM it sleeps its share of a
``--spread-ms`` window (spread evenly, in a shuffled order), writes ``time.time()`` to a pipe
and calls ``os._exit(0)``. Each method then signals all N and waits for them:

- ``engine``: ``coordinator.kill.terminate`` with each child as a target (pidfds on epoll);
  a process's detection time is its outcome's ``ended_at``;
- ``poll50``: check every process with psutil every 50 ms (the loop SGLang uses today);
- ``wait_procs``: ``psutil.wait_procs`` with a callback per exit.

Printed per method: the lag between the last real exit and its detection, the median and max
per-process lag, and the CPU time this process spent while signalling and waiting; then
ratios of the baselines to the engine. Last, the cost of waiting on N live processes for
``--idle-s`` seconds (the engine's exit watcher, the 50 ms poll, ``wait_procs``).

The engine runs on an event loop of its own (``loop.run_until_complete``), not under
``asyncio.run``: on Python 3.11 the runner's SIGINT handler is a partial holding the main
task, and restoring the previous handler formats it, the task's result (the whole report)
included, which is tens of milliseconds of CPU at N = 500 that are the benchmark's own.

``--baseline DIR`` (a checkout of another commit with its own ``.venv``) adds
``engine@DIR``: that tree's kill engine, each run in a process of its own started from DIR,
taking its turn with the others on the same children's shape.

Every child has PR_SET_PDEATHSIG(SIGKILL) and is SIGKILLed and reaped in a ``finally``, so
none outlives the benchmark even when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from coordinator.kill import KillPolicy, Target, terminate
from coordinator.kill.watch import ExitWatcher

RECORD = struct.Struct("=id")
POLL_INTERVAL_S = 0.05


SPAWNER = r"""
import ctypes, os, random, signal, struct, sys, time
n, spread_s, seed, write_fd = int(sys.argv[1]), float(sys.argv[2]), *map(int, sys.argv[3:5])
delays = [spread_s * i / max(n - 1, 1) for i in range(n)]
random.Random(seed).shuffle(delays)
libc = ctypes.CDLL(None)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
pids = []
for delay in delays:
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            signal.sigwait({signal.SIGTERM})
            time.sleep(delay)
            os.write(write_fd, struct.pack("=id", os.getpid(), time.time()))
            os._exit(0)
        finally:
            os._exit(1)
    pids.append(pid)
os.close(write_fd)
sys.stdout.write(" ".join(map(str, pids)) + "\n")
sys.stdout.flush()
for _ in pids:
    os.wait()
sys.stdin.read()
"""
"""Runs as ``python -S -c SPAWNER N SPREAD_S SEED WRITE_FD``: a lean parent (no site, few
imports) that forks the N children, reaps them as they exit, then waits for stdin to close.
The children are not the benchmark's own, as engine processes are not the coordinator's,
and exiting a fork of a small interpreter costs the kernel far less than a fork of this one."""


@dataclass
class Children:
    """Children waiting for SIGTERM, their parent, and the pipe their exit times arrive on."""

    spawner: subprocess.Popen[bytes]
    pids: list[int]
    read_fd: int

    def exit_times(self) -> dict[int, float]:
        data = b""
        while len(data) < RECORD.size * len(self.pids):
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                break
            data += chunk
        return {pid: ts for pid, ts in RECORD.iter_unpack(data)}


def fork_children(n: int, spread_s: float, seed: int) -> Children:
    read_fd, write_fd = os.pipe()
    spawner = subprocess.Popen(
        [sys.executable, "-S", "-c", SPAWNER, str(n), str(spread_s), str(seed), str(write_fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=[write_fd],
    )
    os.close(write_fd)
    assert spawner.stdout is not None
    pids = [int(pid) for pid in spawner.stdout.readline().split()]
    return Children(spawner, pids, read_fd)


def end_children(children: Children) -> None:
    """SIGKILL whatever is left (only processes still children of our spawner), reap all."""
    spawner = children.spawner
    for pid in children.pids:
        try:
            if psutil.Process(pid).ppid() == spawner.pid:
                os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    assert spawner.stdin is not None
    spawner.stdin.close()
    try:
        spawner.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spawner.kill()
        spawner.wait()
    os.close(children.read_fd)


def wait_until_waiting(pids: list[int]) -> None:
    """Every child is parked in sigwait (state S) before timing starts."""
    for pid in pids:
        while psutil.Process(pid).status() != psutil.STATUS_SLEEPING:
            time.sleep(0.001)


# --- methods: each signals all children and returns {pid: detected_at} ---------------------


def by_engine(pids: list[int]) -> dict[int, float]:
    loop = asyncio.new_event_loop()
    try:
        report = loop.run_until_complete(terminate(
            [Target(pid, include_tree=False) for pid in pids],
            KillPolicy(tier_timeout_s=30, deadline_s=60),
        ))
    finally:
        loop.close()
    return {p.pid: p.ended_at for p in report.processes if p.ended_at is not None}


def by_poll50(pids: list[int]) -> dict[int, float]:
    procs = [psutil.Process(pid) for pid in pids]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    detected: dict[int, float] = {}
    alive = procs
    while alive:
        still = []
        for p in alive:
            try:
                running = p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                running = False
            if running:
                still.append(p)
            else:
                detected[p.pid] = time.time()
        alive = still
        if alive:
            time.sleep(POLL_INTERVAL_S)
    return detected


def by_wait_procs(pids: list[int]) -> dict[int, float]:
    procs = [psutil.Process(pid) for pid in pids]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    detected: dict[int, float] = {}
    psutil.wait_procs(procs, timeout=60, callback=lambda p: detected.setdefault(p.pid, time.time()))
    return detected


Method = Callable[[list[int]], dict[int, float]]
METHODS: dict[str, Method] = {"engine": by_engine, "poll50": by_poll50,
                              "wait_procs": by_wait_procs}


@dataclass
class Run:
    last_lag_ms: float
    median_lag_ms: float
    max_lag_ms: float
    cpu_ms: float


def measure(method: Method, n: int, spread_s: float, seed: int) -> Run:
    children = fork_children(n, spread_s, seed)
    try:
        wait_until_waiting(children.pids)
        cpu0 = time.process_time()
        detected = method(children.pids)
        cpu_ms = (time.process_time() - cpu0) * 1000
        exits = children.exit_times()
    finally:
        end_children(children)
    missing = set(children.pids) - set(detected) - set(exits)
    if missing or len(exits) != n:
        raise RuntimeError(f"{len(missing)} exits not detected or recorded")
    lags = [(detected[pid] - exits[pid]) * 1000 for pid in children.pids]
    last = (max(detected.values()) - max(exits.values())) * 1000
    return Run(last, statistics.median(lags), max(lags), cpu_ms)


def idle_cost(name: str, n: int, seconds: float) -> float:
    """% of one core spent waiting ``seconds`` on ``n`` processes that do not exit."""
    children = fork_children(n, 0.0, 0)
    try:
        wait_until_waiting(children.pids)
        procs = [psutil.Process(pid) for pid in children.pids]
        cpu0, wall0 = time.process_time(), time.monotonic()
        if name == "engine":
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(engine_idle(children.pids, seconds))
            finally:
                loop.close()
        elif name == "poll50":
            while time.monotonic() - wall0 < seconds:
                for p in procs:
                    p.is_running() and p.status()
                time.sleep(POLL_INTERVAL_S)
        else:
            psutil.wait_procs(procs, timeout=seconds)
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
    finally:
        end_children(children)
    return 100.0 * cpu / wall


async def engine_idle(pids: list[int], seconds: float) -> None:
    """The engine's exit watcher waiting on ``pids`` that do not exit."""
    watcher = ExitWatcher(lambda _pid: None, use_pidfd=True)
    fds = [os.pidfd_open(pid) for pid in pids]
    for pid, fd in zip(pids, fds, strict=True):
        watcher.watch(pid, fd, 0)
    await watcher.wait(set(pids), seconds)
    watcher.close()
    for fd in fds:
        os.close(fd)


def in_baseline(tree: Path, *args: str) -> Any:
    """Run this file's ``--one`` mode with ``tree``'s Python and packages; its JSON answer."""
    out = subprocess.run(
        [str(tree / ".venv/bin/python"), __file__, *args], cwd=tree, check=True,
        env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout)


def fmt(x: float) -> str:
    return f"{x:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,500")
    parser.add_argument("--spread-ms", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit with its .venv: its engine too")
    parser.add_argument("--one", nargs=3, metavar=("N", "SEED", "IDLE_S"),
                        help=argparse.SUPPRESS)  # the baseline's side: one engine run
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    limit = 4 * max(sizes) if args.one is None else 4 * int(args.one[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, limit + 256), hard))
    if args.one is not None:
        n, seed, idle_s = int(args.one[0]), int(args.one[1]), float(args.one[2])
        if idle_s > 0:
            print(json.dumps(idle_cost("engine", n, idle_s)))
        else:
            print(json.dumps(asdict(measure(by_engine, n, args.spread_ms / 1000, seed))))
        return
    spread_s = args.spread_ms / 1000

    def here(method: Method) -> Callable[[int, int], Run]:
        return lambda n, seed: measure(method, n, spread_s, seed)

    methods = {name: here(method) for name, method in METHODS.items()}
    base_name = ""
    if args.baseline is not None:
        base = args.baseline.resolve()
        base_name = f"engine@{base.name}"

        def baseline(n: int, seed: int) -> Run:
            return Run(**in_baseline(base, "--spread-ms", str(args.spread_ms),
                                     "--one", str(n), str(seed), "0"))

        methods[base_name] = baseline

    print(f"exit detection, exits spread over {args.spread_ms:.0f} ms; "
          f"median of {args.repeats} runs; lags and CPU in ms "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(f"{'N':>5} {'method':<{max(11, len(base_name) + 1)}}{'last-lag':>9}{'med-lag':>9}"
          f"{'max-lag':>9}{'cpu':>9}")
    width = max(11, len(base_name) + 1)
    for n in sizes:
        runs: dict[str, list[Run]] = {name: [] for name in methods}
        for seed in range(args.repeats):  # the methods take turns, run after run
            for name, run in methods.items():
                runs[name].append(run(n, seed))
        results = {name: Run(*(statistics.median(getattr(r, f) for r in rs)
                               for f in ("last_lag_ms", "median_lag_ms", "max_lag_ms",
                                         "cpu_ms")))
                   for name, rs in runs.items()}
        for name, r in results.items():
            print(f"{n:>5} {name:<{width}}{fmt(r.last_lag_ms)} {fmt(r.median_lag_ms)} "
                  f"{fmt(r.max_lag_ms)} {fmt(r.cpu_ms)}")
        eng = results["engine"]
        for other in [name for name in results if name != "engine"]:
            b = results[other]
            print(f"{n:>5}   {other}/engine: last-lag x{b.last_lag_ms / eng.last_lag_ms:.1f}, "
                  f"median lag x{b.median_lag_ms / eng.median_lag_ms:.1f}, "
                  f"cpu x{b.cpu_ms / eng.cpu_ms:.2f}")

    n = max(sizes)
    print(f"\nwaiting {args.idle_s:.0f} s on {n} live processes (% of one core)")
    for name in METHODS:
        print(f"  {name:<{width}}{idle_cost(name, n, args.idle_s):6.2f} %")
    if args.baseline is not None:
        idle = in_baseline(args.baseline.resolve(), "--one", str(n), "0", str(args.idle_s))
        print(f"  {base_name:<{width}}{idle:6.2f} %")


if __name__ == "__main__":
    main()
