"""Drain with request migration against today's two alternatives, in one run.

    .venv/bin/python bench/drain.py [--workers 16] [--streams 64] [--max-tokens 200]

Pod A holds W simulated engines (main process + detokenizer each) and its coordinator; pod B
holds 2 standby engines that only take continuations. R streams go through the reference
router to pod A; once every stream has 5 tokens, pod A is stopped three ways:

- ``migrate``: ``GET /drain`` on pod A's coordinator; the engines use ``worker_client``, hand
  their requests back, and the router continues them on pod B.
- ``wait``: what SGLang and Dynamo do by default: stop sending work, let in-flight requests
  finish, then SIGTERM the engines.
- ``restart``: SIGTERM the stock engines (they SIGKILL their trees) and let the router retry
  each broken request from scratch on pod B.

Measured from the drain call (``time.monotonic``, shared by every process on the host):
every engine's ``shutdown_event`` set (from its end record), every handoff visible on
``/status`` (seen by a separate observer process, so reading the clients' streams here does
not delay it), pod A empty (every engine process gone), every stream complete; tokens lost or
duplicated in the clients' streams.

One drain gives 16 ``shutdown_event`` samples: too few for a p99. ``--push-rounds N`` adds a
repeated measurement (``bench/drain_push.py``): pod A under a continuous load, drained and
aborted N times per event reader of the engines. Every process this script starts is ended by
it, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.drain_push import push_report, run_push  # noqa: E402
from bench.drain_rig import (  # noqa: E402
    pct,
    read_answer,
    slice_note,
    start_router,
    urlsplit_hostport,
)
from bench.handoff_observer import Observer  # noqa: E402
from devstack.sim.launcher import EngineHandle, start_engine  # noqa: E402
from devstack.streaming_load import ClientStream, StreamingLoad  # noqa: E402
from tests.service.servers import FAST, Running, start_coordinator  # noqa: E402
from tests.support.processes import ProcessJanitor, wait_for  # noqa: E402
from worker_client._settings import LATENCY_SLICE_ENV  # noqa: E402

WARM_TOKENS = 5


def prefix_damage(stream: ClientStream) -> tuple[int, int]:
    """(lost, duplicated) tokens against the expected sequence: the expected tokens after the
    longest common prefix, and the received ones after it."""
    want = stream.expected()
    same = 0
    while same < min(len(want), len(stream.tokens)) and want[same] == stream.tokens[same]:
        same += 1
    return len(want) - same, len(stream.tokens) - same


@dataclass
class Result:
    mode: str
    shutdown_ms: list[float] = field(default_factory=list)
    """From the drain call to each engine's shutdown_event set."""
    push_ms: list[float] = field(default_factory=list)
    """From the coordinator's drain start (its started_at) to each shutdown_event set."""
    loop_hop_ms: list[float] = field(default_factory=list)
    """From the drain line read off the socket to shutdown_event set on the engine's loop."""
    handoff_ms: list[float] = field(default_factory=list)
    empty_ms: float = 0.0
    streams_done_ms: float = 0.0
    lost: int = 0
    duplicated: int = 0
    incomplete: int = 0


async def run_mode(mode: str, args: argparse.Namespace, tmp: Path) -> Result:
    janitor = ProcessJanitor()
    try:
        return await _run_mode(janitor, mode, args, tmp / mode)
    finally:
        janitor.close()


async def _run_mode(janitor: ProcessJanitor, mode: str, args: argparse.Namespace,
                    tmp: Path) -> Result:
    tmp.mkdir(parents=True)  # noqa: ASYNC240 (before anything runs)
    knobs: dict[str, Any] = {"schedulers": 0, "token_interval_ms": args.token_interval_ms,
                             "graceful_main": mode != "restart"}
    # 1. Pod A (W engines, with a coordinator they register with in "migrate") and pod B.
    coord_a: Running | None = None
    if mode == "migrate":
        coord_a = start_coordinator(janitor, tmp, *FAST, "--grace-period", "60", name="a")
        knobs_a = {**knobs, "coordinator": coord_a.url}
    else:
        knobs_a = knobs
    pod_a = [start_engine(janitor.spawn, tmp / f"a{i}", **knobs_a) for i in range(args.workers)]
    coord_b = start_coordinator(janitor, tmp, *FAST, name="b")
    pod_b = [start_engine(janitor.spawn, tmp / f"b{i}", **knobs) for i in range(2)]
    if coord_a is not None:
        wait_for(lambda: sum(w["connected"] for w in coord_a.status()["workers"]) == args.workers,
                 what="pod A registered", timeout=120)
    router = start_router(janitor, tmp, pod_a, coord_a, pod_b, coord_b,
                          "restart" if mode == "restart" else "continue")
    # 2. The load, warmed up.
    load = StreamingLoad(router, [f"bench {mode} {i}" for i in range(args.streams)],
                         args.max_tokens, request_id_prefix="b", warm_tokens=WARM_TOKENS)
    clients = asyncio.create_task(load.run())
    await asyncio.wait_for(load.flowing.wait(), 120)
    result = Result(mode)
    # 3. Stop pod A, the mode's way.
    t0 = time.monotonic()
    if mode == "migrate":
        assert coord_a is not None
        observer = Observer(janitor, coord_a.url)
        sock = socket.create_connection(urlsplit_hostport(coord_a.url))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The call leaves on a connection opened beforehand: t0 is when its bytes are sent.
        t0_wall = time.time()
        t0 = time.monotonic()
        sock.sendall(b"GET /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        drain = asyncio.create_task(asyncio.to_thread(read_answer, sock))
    elif mode == "restart":
        for engine in pod_a:
            os.kill(engine.pid, signal.SIGTERM)
    empty = asyncio.create_task(asyncio.to_thread(wait_pod_empty, pod_a))
    if mode == "wait":
        await wait_streams_of(pod_a)
        for engine in pod_a:
            os.kill(engine.pid, signal.SIGTERM)
    result.empty_ms = (await empty - t0) * 1000
    streams = await asyncio.wait_for(clients, 300)
    result.streams_done_ms = (max(s.done_at or t0 for s in streams) - t0) * 1000
    if mode == "migrate":
        started_at = (await drain)["drain"]["started_at"]
        result.handoff_ms = [(at - t0_wall) * 1000
                             for at in observer.visible_at(0, observer.count)]
        for engine in pod_a:
            times = (engine.record_of(engine.pid) or {}).get("worker_client") or {}
            set_at = times.get("shutdown_event_set_at_monotonic")
            if set_at is not None:
                result.shutdown_ms.append((set_at - t0) * 1000)
                result.push_ms.append((times["shutdown_event_set_at"] - started_at) * 1000)
                result.loop_hop_ms.append((set_at - times["drain_received_at_monotonic"]) * 1000)
    for s in streams:
        lost, dup = prefix_damage(s)
        result.lost += lost
        result.duplicated += dup
        result.incomplete += s.done_at is None
    return result


def wait_pod_empty(pod: list[EngineHandle]) -> float:
    """Block until every process of pod A is gone; returns time.monotonic() then."""
    procs = []
    for engine in pod:
        for p in engine.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(p.pid))
    psutil.wait_procs(procs, timeout=300)
    return time.monotonic()


async def wait_streams_of(pod: list[EngineHandle]) -> None:
    """Until no engine of ``pod`` has a request in flight (the "wait" alternative)."""
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            answers = await asyncio.gather(*(http.get(f"{e.url}/health") for e in pod))
            if all(a.json()["inflight"] == 0 for a in answers):
                return
            await asyncio.sleep(0.02)


def report(results: list[Result], args: argparse.Namespace) -> str:
    by = {r.mode: r for r in results}
    lines = [f"drain of {args.workers} workers x {args.streams} streams "
             f"({args.max_tokens} tokens, {args.token_interval_ms:g} ms/token), "
             f"{os.cpu_count()} CPUs{slice_note(args)}", "",
             f"{'mode':<9}{'pod empty':>12}{'streams done':>14}{'lost':>7}{'dup':>7}"
             f"{'incomplete':>12}"]
    for r in results:
        lines.append(f"{r.mode:<9}{r.empty_ms:>10.0f}ms{r.streams_done_ms:>12.0f}ms"
                     f"{r.lost:>7}{r.duplicated:>7}{r.incomplete:>12}")
    m = by.get("migrate")
    if m:
        lines += ["", f"migrate: shutdown_event set p50 {pct(m.shutdown_ms, .5):.1f} ms, "
                  f"p99 {pct(m.shutdown_ms, .99):.1f} ms, max {max(m.shutdown_ms or [0]):.1f} ms"
                  f" ({len(m.shutdown_ms)} workers)",
                  f"migrate: shutdown_event set after the coordinator's drain start p50 "
                  f"{pct(m.push_ms, .5):.1f} ms, p99 {pct(m.push_ms, .99):.1f} ms; socket to loop "
                  f"p50 {pct(m.loop_hop_ms, .5):.2f} ms, p99 {pct(m.loop_hop_ms, .99):.2f} ms",
                  f"migrate: handoff visible on /status p50 {pct(m.handoff_ms, .5):.1f} ms, "
                  f"p99 {pct(m.handoff_ms, .99):.1f} ms ({len(m.handoff_ms)} handoffs)"]
        for other in ("wait", "restart"):
            o = by.get(other)
            if o and m.empty_ms and m.streams_done_ms:
                lines.append(f"{other} / migrate: pod empty x{o.empty_ms / m.empty_ms:.1f}, "
                             f"streams done x{o.streams_done_ms / m.streams_done_ms:.2f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--token-interval-ms", type=float, default=50.0)
    parser.add_argument("--modes", default="migrate,wait,restart",
                        help="single-drain comparisons to run (empty: none)")
    parser.add_argument("--push-rounds", type=int, default=0,
                        help="repeated drain/abort rounds per reader and stream count")
    parser.add_argument("--push-streams", default="0,16,64",
                        help="stream counts for the repeated drains")
    parser.add_argument("--push-readers", default="loop,thread")
    parser.add_argument("--push-tokens", type=int, default=40)
    parser.add_argument("--latency-slice-us", type=int, metavar="US",
                        help="pod A's engines' WorkerClient latency_slice_us: a slice kept "
                             "for good, or 0 (scheduling left alone); default: the client's "
                             "(a 100 us slice from the doorbell's ring)")
    parser.add_argument("--keep-timings", metavar="DIR",
                        help="keep the workers' per-drain timing records there (NDJSON)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.latency_slice_us is not None:
        os.environ[LATENCY_SLICE_ENV] = str(args.latency_slice_us)  # the engines inherit it

    results = []
    pushes = []
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        for mode in filter(None, args.modes.split(",")):
            results.append(asyncio.run(run_mode(mode, args, Path(tmp))))
            print(f"{mode}: done", file=sys.stderr, flush=True)
        if args.push_rounds:
            for streams in (int(n) for n in args.push_streams.split(",")):
                for reader in args.push_readers.split(","):
                    pushes.append(asyncio.run(run_push(args, Path(tmp), reader, streams)))
                    print(f"push {reader} x{streams}: done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"drains": [r.__dict__ for r in results],
                          "repeated": [p.__dict__ for p in pushes]}))
        return 0
    if results:
        print(report(results, args))
    if pushes:
        print(("\n" if results else "") + push_report(pushes, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
