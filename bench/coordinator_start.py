"""How long a coordinator takes from its start to answering ``/healthz``, against the engine
it runs beside.

    .venv/bin/python -m bench.coordinator_start [--repeats 20] [--before DIR] [--pods N]

A new pod in a rolling update starts its coordinator and its engine together (the native
sidecar has no startup probe), and is Ready once both answer: a coordinator slower to answer
than the engine holds the pod back, and on a node with few cores its start also takes CPU
from the engine starting beside it. Each variant is a fresh process, started ``--repeats``
times, the variants taken in turn so that other work on the machine weighs on all alike:

- ``coordinator``: ``python -m coordinator serve --port P --log-level warning``, until
  ``GET /healthz`` answers 200;
- ``coordinator + router``: the same as a pod behind smg runs it (``--router smg=URL
  --router-worker-url URL``; nothing listens at either, so its join keeps waiting for the
  engine's health in the background, as it does while an engine loads);
- ``simulated engine``: the rollout's engine (``python -m devstack.sim``, one scheduler, a
  detokenizer), until ``GET /health`` answers 200: the baseline;
- ``python -c pass``: the interpreter alone, start to exit: the floor of any Python process.

With ``--before DIR`` (a checkout of another commit: ``git archive REV | tar -x -C DIR``) the
two coordinator variants also run from ``DIR``, in the same turns, so a change is measured
before and after on the same machine at the same time.

Both trees' bytecode is compiled first (``compileall``), as in an image: with
``PYTHONDONTWRITEBYTECODE`` set, a module changed since its last compilation would otherwise
be compiled from source at every start. A start is the moment before ``Popen``; the answer
is polled over a fresh connection every ``POLL_S`` (a connection made once the process
listens waits in its backlog, so the answer is seen as it is sent). The processes run from
this virtualenv, with the test extras: there httpx (loaded by a coordinator with routers)
also loads its command line's rich and pygments, about 35 ms that an image without the
extras does not pay.

Printed per variant: p50, p90 and max (the nearest-rank percentiles of ``--repeats``
starts), the ratio of its p50 to the simulated engine's and, with ``--before``, to the same
variant before; and the 1-minute load average before and after, which says how busy the
machine was. Every process started here is ended (its whole session) before the next
starts.

With ``--pods N`` (smg installed: ``scripts/engines.sh routers``), also where a new pod's
start → Ready goes in the rolling-update rig (``bench/rollout_pods.py``): N pods added one
after another behind smg, with a coordinator and without, each start watched every
``WATCH_S`` by a thread of this process (its looks cost some CPU too) for the engine's ready
file, the coordinator's ``/healthz``, the engine's registration and smg routing to it; the
router join's end comes from the coordinator's ``/status``. Printed: the median of each,
from the pod's start, and the range; every process of the rig ended by its ``close()``.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.rollout_load import percentile
from bench.rollout_pods import Deployment, Kube, Strategy
from devstack.local_stack import LocalStack
from devstack.sim.launcher import READY_FILE_NAME

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.002
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PACKAGES = ("coordinator", "devstack", "worker_client", "shutdown_wire", "router_client")
"""What the processes measured import from a tree (compiled before measuring)."""


@dataclass(frozen=True)
class Variant:
    name: str
    argv: tuple[str, ...]
    """``{port}`` and ``{dir}`` (a scratch directory of this start) are filled in."""
    path: str | None
    """The path polled for 200; None: the process's exit is its end."""
    tree: Path = ROOT
    """The checkout it runs from (first on ``PYTHONPATH``, and the working directory)."""


@dataclass
class Timings:
    variant: Variant
    seconds: list[float] = field(default_factory=list)

    def p(self, q: float) -> float:
        value = percentile(self.seconds, q)
        assert value is not None
        return value


def variants(before: Path | None) -> list[Variant]:
    serve = (sys.executable, "-m", "coordinator", "serve", "--port", "{port}",
             "--log-level", "warning")
    routed = (*serve, "--router", "smg=http://127.0.0.1:9", "--router-worker-url",
              "http://127.0.0.1:9")
    engine = (sys.executable, "-m", "devstack.sim", "--port", "{port}", "--record-dir",
              "{dir}", "--schedulers", "1")
    made = [Variant("coordinator", serve, "/healthz"),
            Variant("coordinator + router", routed, "/healthz"),
            Variant("simulated engine", engine, "/health"),
            Variant("python -c pass", (sys.executable, "-c", "pass"), None)]
    if before is not None:
        made[2:2] = [Variant("coordinator (before)", serve, "/healthz", before),
                     Variant("coordinator + router (before)", routed, "/healthz", before)]
    return made


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers(port: int, path: str) -> bool:
    """One ``GET path`` on a fresh connection: True on 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=START_TIMEOUT_S)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_once(variant: Variant, scratch: Path) -> float:
    """Seconds from ``Popen`` to the first 200 (or to the exit, for a variant without a
    path); the process and its session ended before returning."""
    port = free_port()
    argv = [arg.format(port=port, dir=scratch) for arg in variant.argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(variant.tree), os.environ.get("PYTHONPATH")) if p)}
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=variant.tree, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        if variant.path is None:
            proc.wait(START_TIMEOUT_S)
            return time.monotonic() - began
        while not answers(port, variant.path):
            if proc.poll() is not None:
                raise RuntimeError(f"{variant.name} exited {proc.returncode} before answering")
            if time.monotonic() - began > START_TIMEOUT_S:
                raise RuntimeError(f"{variant.name} did not answer in {START_TIMEOUT_S:.0f}s")
            time.sleep(POLL_S)
        return time.monotonic() - began
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's session (the engine's children too), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(STOP_TIMEOUT_S)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def compile_trees(chosen: Sequence[Variant]) -> None:
    """Compile every tree's bytecode, as an image does at build time."""
    for tree in sorted({v.tree for v in chosen}):
        for package in PACKAGES:
            if (tree / package).is_dir():
                compileall.compile_dir(tree / package, quiet=1)


def measure(chosen: Sequence[Variant], repeats: int, scratch: Path) -> list[Timings]:
    """One unmeasured start of each (bytecode compiled, files cached), then ``repeats``
    turns, each variant once per turn."""
    timings = [Timings(v) for v in chosen]
    for turn in range(repeats + 1):
        for t in timings:
            where = scratch / f"{len(t.seconds)}-{t.variant.name.replace(' ', '_')}"
            where.mkdir(parents=True, exist_ok=True)
            took = start_once(t.variant, where)
            if turn > 0:
                t.seconds.append(took)
    return timings


def report(timings: list[Timings], load: tuple[float, float], repeats: int) -> str:
    by_name = {t.variant.name: t for t in timings}
    engine = by_name["simulated engine"].p(50)
    lines = [f"coordinator start → first answer, {repeats} starts each, variants in turn; "
             f"{os.cpu_count()} CPUs, {platform.platform()}, Python "
             f"{platform.python_version()}; load average {load[0]:.2f} → {load[1]:.2f}", "",
             "| process | p50 ms | p90 ms | max ms | p50 vs the engine | p50 vs before |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for t in timings:
        before = by_name.get(f"{t.variant.name} (before)")
        versus = f"{t.p(50) / before.p(50):.2f}x" if before is not None else ""
        lines.append(f"| {t.variant.name} | {t.p(50) * 1000:.0f} | {t.p(90) * 1000:.0f} | "
                     f"{max(t.seconds) * 1000:.0f} | {t.p(50) / engine:.2f}x | {versus} |")
    return "\n".join(lines)


# --- a new pod of the rollout, step by step -----------------------------------------------------

WATCH_S = 0.01
STEPS = ("engine ready file", "coordinator /healthz", "engine registered", "router join done",
         "smg routes to it", "Ready (the rig)")


def watch(stack: LocalStack, name: str, router_url: str, t0: float, seen: dict[str, float],
          stop: threading.Event) -> None:
    """Record in ``seen`` when each step of ``name``'s start is first seen (seconds from
    ``t0``), until ``stop``."""
    port_file = stack.workdir / f"{name}-coordinator.port.json"
    ready_file = stack.workdir / f"{name}-records" / READY_FILE_NAME

    def url_in(path: Path) -> str | None:
        return str(json.loads(path.read_text())["url"]) if path.exists() else None

    def step(what: str, done: bool) -> None:
        if done:
            seen.setdefault(what, time.monotonic() - t0)

    with httpx.Client(timeout=5) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
                engine, coordinator = url_in(ready_file), url_in(port_file)
                step("engine ready file", engine is not None)
                if coordinator is not None and "engine registered" not in seen:
                    step("coordinator /healthz",
                         http.get(f"{coordinator}/healthz").status_code == 200)
                    workers = http.get(f"{coordinator}/status").json()["workers"]
                    step("engine registered", any(w.get("connected") for w in workers))
                if engine is not None and "smg routes to it" not in seen:
                    listed = http.get(f"{router_url}/workers").json().get("workers", [])
                    step("smg routes to it", any(
                        str(w["url"]).rstrip("/") == engine and w.get("status") == "ready"
                        for w in listed))
            time.sleep(WATCH_S)


def pod_steps(coordinator: bool, count: int, workdir: Path) -> list[dict[str, float]]:
    """``count`` new pods behind smg (one old pod first), each step of each start."""
    strategy = Strategy("watched", "watched", coordinator=coordinator)
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(workdir)
    rows = []
    try:
        deployment = Deployment(stack, strategy, Kube(), token_interval_ms=20.0)
        deployment.start(1)
        for i in range(count):
            seen: dict[str, float] = {}
            stop = threading.Event()
            t0 = time.monotonic()
            watcher = threading.Thread(target=watch, args=(
                stack, f"new{i}", deployment.router.url, t0, seen, stop))
            watcher.start()
            try:
                pod = deployment.surge(f"new{i}")
                seen["Ready (the rig)"] = time.monotonic() - t0
            finally:
                stop.set()
                watcher.join()
            if pod.coordinator is not None:
                status = httpx.get(f"{pod.coordinator.url}/status", timeout=5).json()
                joined = [r["at"] for r in status["routers"] if r["state"] == "joined"]
                if joined:  # epoch seconds, taken to this clock
                    seen["router join done"] = joined[0] - (time.time() - time.monotonic()) - t0
            rows.append(seen)
    finally:
        asyncio.run(stack.close())
    return rows


def steps_report(rows_by: dict[str, list[dict[str, float]]]) -> str:
    names = list(rows_by)
    counts = ", ".join(f"{name}: {len(rows)} pods" for name, rows in rows_by.items())
    lines = ["", f"a new pod in the rollout rig, ms from its start, median (min-max) ({counts}):",
             "",
             "| step | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for step in STEPS:
        cells = []
        for name in names:
            values = [row[step] for row in rows_by[name] if step in row]
            cells.append(f"{statistics.median(values) * 1000:.0f} ({min(values) * 1000:.0f}-"
                         f"{max(values) * 1000:.0f})" if values else "-")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coordinator_start",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout whose coordinator runs in the same turns")
    parser.add_argument("--pods", type=int, default=0,
                        help="also this many new pods of the rollout rig, step by step "
                             "(needs smg)")
    args = parser.parse_args(argv)
    before = args.before.resolve() if args.before is not None else None
    if before is not None and not (before / "coordinator" / "__init__.py").exists():
        parser.error(f"{before} holds no coordinator/")
    chosen = variants(before)
    compile_trees(chosen)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="coordinator-start-") as tmp:
        timings = measure(chosen, args.repeats, Path(tmp))
    print(report(timings, (load_before, os.getloadavg()[0]), args.repeats), flush=True)
    if args.pods:
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="pod-start-") as tmp:
            rows_by = {name: pod_steps(coordinator, args.pods, Path(tmp) / name.split()[0])
                       for name, coordinator in (("with the coordinator", True),
                                                 ("without", False))}
        print(steps_report(rows_by))
        print(f"load average {load_before:.2f} → {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
