"""Register an unmodified engine with the coordinator, with the kill tiers its tree needs.

``--adopt-pattern`` makes the coordinator drain a tree that never registers, in the default
order (deepest first). Engines whose parents watch their children need another order (see
``engine_tiers.py``); an engine that cannot import ``worker_client`` gets it by being
registered from outside: this script finds the engine's main process by a command-line
pattern (as adoption does) and registers that PID, with its identity (start time) and the
engine's tiers, through the same ``POST /workers`` a worker would call.

Run it next to the coordinator once the engine started (e.g. a ``postStart`` hook, or a loop
in the coordinator's container)::

    python deploy/examples/unmodified/register_engine.py --engine vllm \\
        --pattern 'vllm\\.entrypoints\\.openai\\.api_server' --coordinator http://127.0.0.1:8787

It waits up to ``--wait`` seconds for a matching process and exits 0 once registered, 1 when
none appeared, 2 when the coordinator refused the registration. It reads /proc only, so it
runs anywhere the coordinator's process namespace is visible (``shareProcessNamespace``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_tiers import ENGINE_TIERS

EXIT_REGISTERED = 0
EXIT_NOT_FOUND = 1
EXIT_REFUSED = 2
POLL_S = 0.5


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def find_root(pattern: re.Pattern[str]) -> int | None:
    """The topmost process whose command line matches (its matching children are its tree)."""
    me = os.getpid()
    matches = {
        int(entry.name) for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != me
        and pattern.search(cmdline(int(entry.name)))
    }
    for pid in sorted(matches):
        ancestor = parent(pid)
        while ancestor and ancestor not in matches:
            ancestor = parent(ancestor)
        if not ancestor:
            return pid
    return None


def start_time(pid: int) -> float | None:
    """Start time (epoch s) the way the coordinator computes a process's identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_bytes().splitlines()
                     if line.startswith(b"btime"))
    except (OSError, StopIteration):
        return None
    ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def registration(pid: int, engine: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "pid": pid, "role": engine, "name": f"{engine}-{pid}", "include_tree": True,
        "tiers": ENGINE_TIERS[engine],
    }
    started = start_time(pid)
    if started is not None:
        body["start_time"] = started
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=sorted(ENGINE_TIERS), required=True)
    parser.add_argument("--pattern", required=True, help="regex searched in command lines")
    parser.add_argument("--coordinator",
                        default=os.environ.get("SHUTDOWN_COORDINATOR_URL", "http://127.0.0.1:8787"))
    parser.add_argument("--token-file", default=os.environ.get("SHUTDOWN_COORDINATOR_TOKEN_FILE"))
    parser.add_argument("--wait", type=float, default=300.0,
                        help="seconds to wait for the engine's process (default 300)")
    args = parser.parse_args(argv)

    headers = {}
    if args.token_file:
        headers["Authorization"] = "Bearer " + Path(args.token_file).read_text().strip()
    pattern = re.compile(args.pattern)
    deadline = time.monotonic() + args.wait
    pid = find_root(pattern)
    while pid is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
        pid = find_root(pattern)
    if pid is None:
        print(f"no process matches {args.pattern!r}", file=sys.stderr)
        return EXIT_NOT_FOUND

    body = registration(pid, args.engine)
    while True:
        try:
            response = httpx.post(args.coordinator.rstrip("/") + "/workers", json=body,
                                  headers=headers, timeout=10)
        except httpx.TransportError as exc:
            if time.monotonic() > deadline:
                print(f"coordinator unreachable: {exc}", file=sys.stderr)
                return EXIT_REFUSED
            time.sleep(POLL_S)
            continue
        if response.status_code in (200, 201):
            print(f"registered {args.engine} pid {pid} as {response.json()['id']}")
            return EXIT_REGISTERED
        if response.status_code < 500 or time.monotonic() > deadline:
            print(f"coordinator refused ({response.status_code}): {response.text}",
                  file=sys.stderr)
            return EXIT_REFUSED
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
