"""The coordinator's start: CPU from its exec to its first ``/healthz`` answer, and to its API.

    python -m bench.start_cost [--rounds 7] [--baseline DIR] [-- SERVE_FLAGS...]

Every new pod of a rollout pays this, on the same cores as the engines starting beside it
(docs/benchmarks.md, the rolling update's two controls). Each round starts
``python -m coordinator serve --port 0 --port-file F`` (plus ``SERVE_FLAGS``), polls ``F``
and then ``GET /healthz`` every 2 ms on a socket of its own, and at the first 200 SIGKILLs the
coordinator and takes its CPU time (user + system, every thread) from ``wait4``: what the
kernel charged it from its start to that moment, whatever else the machine ran. A second
start in the same round goes on past ``/healthz`` to the API its callers use first (``API``:
a router's ``GET /status?view=router``, then ``GET /plan`` through the framework's routing,
validation and serialisation) and is charged at their 200s: work deferred from the start to
a first request is counted there, not lost. The
interpreter alone (``python -c pass`` with the same virtualenv) runs in the same rounds, as
the floor; with ``--baseline DIR`` (a checkout of another commit, with its own ``.venv``)
that tree's coordinator takes its turn too, and the ratios are printed. Medians of
``--rounds``; the bytecode is compiled before the first round (as in an image).

On a loaded machine CPU time swells with the load (cache and core contention) and its spread
hides a cut of a few per cent. ``--instructions`` counts instead, with callgrind, the
instructions of one start to ``/healthz`` and one to the API per side (``bench/start_probe.py``,
the same ``serve`` in one process, ended at the last 200 by a thread of its own), and of
``python -c pass``: counts that do not move with the load (to about 1 %).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.start_probe import answers

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.002


@dataclass
class Side:
    name: str
    tree: Path
    python: str


HEALTHZ = ("/healthz",)
API = ("/healthz", "/status?view=router", "/plan")
"""The requests a start is charged to: its liveness, or the API its callers use first."""


def cpu_of(pid: int) -> tuple[float, float]:
    """SIGKILL ``pid`` (our child) and reap it: its (user, system) CPU seconds."""
    os.kill(pid, signal.SIGKILL)
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_utime, usage.ru_stime


def start_once(side: Side, tmp: Path, flags: list[str],
               paths: tuple[str, ...] = HEALTHZ) -> tuple[float, float, float]:
    """(CPU s, of it system s, wall s) of one coordinator start to the first 200 of each of
    ``paths`` in turn (the first polled until it answers, the others asked once)."""
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
            if port is not None and answers(port, paths[0]):
                for path in paths[1:]:
                    if not answers(port, path):
                        raise SystemExit(f"{side.name}: GET {path} did not answer 200")
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


def instructions(python: str, tree: Path, args: list[str]) -> int:
    """Instructions callgrind counts for ``python args`` run in ``tree``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, *args],
        cwd=tree, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode != 0:
        raise SystemExit(f"{python} {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    counted = [line for line in done.stderr.splitlines() if "Collected :" in line]
    return int(counted[-1].rsplit(":", 1)[1])


def count_instructions(sides: list[Side], flags: list[str]) -> None:
    """``--instructions``: one callgrind run per side and target, and the floor."""
    probe = str(ROOT / "bench" / "start_probe.py")
    targets = {"/healthz": HEALTHZ, "API": API}
    floor = instructions(sys.executable, ROOT, ["-c", "pass"])
    print("coordinator start, instructions (callgrind, one run each; load average "
          f"{os.getloadavg()[0]:.2f})")
    print(f"  {'python -c pass (the floor)':<40} {floor / 1e6:8.0f} M")
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for target, paths in targets.items():
            for side in sides:
                n = instructions(side.python, side.tree,
                                 [probe, str(Path(tmp) / "port.json"), ",".join(paths), *flags])
                counts[side.name, target] = n
                print(f"  {side.name + ' to ' + target:<40} {n / 1e6:8.0f} M; "
                      f"x{n / floor:.1f} the floor", flush=True)
    if len(sides) == 2:
        for target in targets:
            ratio = counts[sides[1].name, target] / counts[sides[0].name, target]
            print(f"  this / baseline to {target}: instructions x{ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit with its .venv, started in turn")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions with callgrind instead of timing CPU")
    parser.add_argument("flags", nargs="*", help="more `serve` flags (after --)")
    args = parser.parse_args()
    sides = [Side("this tree", ROOT, sys.executable)]
    if args.baseline is not None:
        base = args.baseline.resolve()
        sides.insert(0, Side(f"baseline ({base.name})", base, str(base / ".venv/bin/python")))
    for side in sides:
        compileall.compile_dir(side.tree / "coordinator", quiet=1)
    if args.instructions:
        count_instructions(sides, args.flags)
        return
    targets = {"/healthz": HEALTHZ, "API": API}
    runs = [(side, target) for target in targets for side in sides]
    cpu: dict[tuple[str, str], list[float]] = {(s.name, t): [] for s, t in runs}
    sys_cpu: dict[tuple[str, str], list[float]] = {(s.name, t): [] for s, t in runs}
    wall: dict[tuple[str, str], list[float]] = {(s.name, t): [] for s, t in runs}
    floor: list[float] = []
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for side in sides:  # a first start of each, not timed: the page cache warm for all
            start_once(side, Path(tmp), args.flags, API)
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            floor.append(interpreter_once(sys.executable))
            for side, target in runs:
                c, s, w = start_once(side, Path(tmp), args.flags, targets[target])
                cpu[side.name, target].append(c)
                sys_cpu[side.name, target].append(s)
                wall[side.name, target].append(w)
    print(f"coordinator start, median of {args.rounds} rounds "
          f"(load average {min(loads):.2f}-{max(loads):.2f})")
    base_floor = statistics.median(floor)
    print(f"  {'python -c pass (the floor)':<40} CPU {base_floor * 1000:6.1f} ms")
    medians = {}
    for side, target in runs:
        key = (side.name, target)
        c = statistics.median(cpu[key])
        medians[key] = c
        print(f"  {side.name + ' to ' + target:<40} CPU {c * 1000:6.1f} ms (system "
              f"{statistics.median(sys_cpu[key]) * 1000:.1f}; rounds "
              f"{min(cpu[key]) * 1000:.0f}-{max(cpu[key]) * 1000:.0f}), wall "
              f"{statistics.median(wall[key]) * 1000:6.1f} ms; x{c / base_floor:.1f} the floor")
    if len(sides) == 2:
        for target in targets:
            ratio = medians[sides[1].name, target] / medians[sides[0].name, target]
            print(f"  this / baseline to {target}: CPU x{ratio:.2f}")


if __name__ == "__main__":
    main()
