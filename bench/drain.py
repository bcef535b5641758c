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
repeated measurement: pod A under a continuous load of R streams (each client starts its next
stream when one ends), drained and aborted N times, once per event reader of the engines
(``loop``: the worker client reads its stream on the engine's loop; ``thread``: a reader
thread). Each round waits until all R streams run on pod A, sends the drain, then collects each
worker's ``notified_at`` (when its ``shutdown_event`` was set, reported by the worker client)
and each handoff's first sight by the observer process. Every process this script starts is
ended by it, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.handoff_observer import Observer  # noqa: E402
from coordinator.sim.launcher import EngineHandle, start_engine  # noqa: E402
from coordinator.sim.tokens import expected_tokens  # noqa: E402
from router_client import sse  # noqa: E402
from tests.service.servers import FAST, Running, start_coordinator  # noqa: E402
from tests.support.processes import ProcessJanitor, wait_for  # noqa: E402

WARM_TOKENS = 5
NO_COORDINATOR = "http://127.0.0.1:9"


@dataclass
class Stream:
    prompt: str
    max_tokens: int
    tokens: list[str] = field(default_factory=list)
    done_at: float | None = None

    def damage(self) -> tuple[int, int]:
        """(lost, duplicated) tokens against the expected sequence."""
        want = expected_tokens(self.prompt, self.max_tokens)
        same = 0
        while same < min(len(want), len(self.tokens)) and want[same] == self.tokens[same]:
            same += 1
        return len(want) - same, len(self.tokens) - same


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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    streams = [Stream(f"bench {mode} {i}", args.max_tokens) for i in range(args.streams)]
    warm = asyncio.Event()
    counter = [0]
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0),
                             limits=httpx.Limits(max_connections=args.streams + 16))
    load = asyncio.gather(*(one_stream(http, router, i, s, warm, counter, args.streams)
                            for i, s in enumerate(streams)))
    await asyncio.wait_for(warm.wait(), 120)
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
        sock.sendall(b"GET /drain HTTP/1.1\r\nHost: coordinator\r\nConnection: close\r\n\r\n")
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
    await asyncio.wait_for(load, 300)
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
    await http.aclose()
    for s in streams:
        lost, dup = s.damage()
        result.lost += lost
        result.duplicated += dup
        result.incomplete += s.done_at is None
    return result


def start_router(janitor: ProcessJanitor, tmp: Path, pod_a: list[EngineHandle],
                 coord_a: Running | None, pod_b: list[EngineHandle], coord_b: Running,
                 resume: str) -> str:
    ready = tmp / "router.json"
    argv = ["-m", "router_client.reference_router", "--port", "0", "--ready-file", str(ready),
            "--resume", resume]
    for e in pod_a:
        argv += ["--worker", f"{e.url}={coord_a.url if coord_a else NO_COORDINATOR}"]
    for e in pod_b:
        argv += ["--standby-worker", f"{e.url}={coord_b.url}"]
    janitor.spawn_python(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    wait_for(ready.exists, what="router ready")
    return str(json.loads(ready.read_text())["url"])


async def one_stream(http: httpx.AsyncClient, router: str, i: int, stream: Stream,
                     warm: asyncio.Event, counter: list[int], total: int) -> None:
    body = {"prompt": stream.prompt, "max_tokens": stream.max_tokens, "stream": True}
    async with http.stream("POST", f"{router}/v1/completions", json=body,
                           headers={"X-Request-Id": f"b{i}"}) as resp:
        async for event in sse.events(resp.aiter_lines()):
            if event == sse.DONE:
                stream.done_at = time.monotonic()
                break
            if not isinstance(event, dict) or "error" in event:
                break
            stream.tokens.append(sse.chunk_text(event))
            if len(stream.tokens) == WARM_TOKENS:
                counter[0] += 1
                if counter[0] == total:
                    warm.set()


def urlsplit_hostport(url: str) -> tuple[str, int]:
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
             f"{os.cpu_count()} CPUs", "",
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


# --- repeated drains: shutdown_event and handoff visibility percentiles ---------------------


@dataclass
class PushResult:
    reader: str
    streams: int
    rounds: int = 0
    shutdown_ms: list[float] = field(default_factory=list)
    """From the drain call to each worker's shutdown_event set (every round)."""
    push_ms: list[float] = field(default_factory=list)
    """From the coordinator's drain start to each shutdown_event set."""
    handoff_ms: list[float] = field(default_factory=list)
    received_ms: list[float] = field(default_factory=list)
    """From the coordinator's drain start to the drain line read off each worker's socket."""
    hop_ms: list[float] = field(default_factory=list)
    """From the line read to shutdown_event set (same process)."""
    written_ms: list[float] = field(default_factory=list)
    """From the coordinator's drain start to the line handed to each stream's transport."""
    written_to_set_ms: list[float] = field(default_factory=list)
    """From that write to the worker's shutdown_event set."""
    call_to_start_ms: list[float] = field(default_factory=list)
    """From the drain call to the coordinator's drain start (one per round)."""
    sources: dict[str, int] = field(default_factory=dict)
    """How the workers learnt of each drain: push (the drain line), hello (a stream opened
    during the drain), register."""


async def run_push(args: argparse.Namespace, tmp: Path, reader: str, streams: int,
                   ) -> PushResult:
    os.environ["WORKER_CLIENT_EVENT_READER"] = reader  # the engines inherit it
    timings = tmp / f"timings-{reader}-{streams}.ndjson"
    os.environ["WORKER_CLIENT_TIMINGS"] = str(timings)
    janitor = ProcessJanitor()
    try:
        result = await _run_push(janitor, args, tmp / f"push-{reader}-{streams}", reader,
                                 streams)
    finally:
        janitor.close()
        os.environ.pop("WORKER_CLIENT_EVENT_READER", None)
        os.environ.pop("WORKER_CLIENT_TIMINGS", None)
    add_timings(result, timings)
    return result


def add_timings(result: PushResult, path: Path) -> None:
    """The workers' own per-drain records: where the time between the coordinator's drain
    start and shutdown_event goes, and how each drain was learnt."""
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        source = str(record["source"])
        result.sources[source] = result.sources.get(source, 0) + 1
        if record["started_at"] is not None:
            result.received_ms.append((record["received_at"] - record["started_at"]) * 1000)
        result.hop_ms.append((record["set_at"] - record["received_at"]) * 1000)


async def _run_push(janitor: ProcessJanitor, args: argparse.Namespace, tmp: Path,
                    reader: str, streams: int) -> PushResult:
    tmp.mkdir(parents=True)  # noqa: ASYNC240 (before anything runs)
    knobs: dict[str, Any] = {"schedulers": 0, "token_interval_ms": args.token_interval_ms,
                             "graceful_main": True}
    # 1. Pod A, pod B, the router; a registered sleeper that reports 1 in flight holds every
    #    drain in migrating, so DELETE /drain can end each round before any kill.
    coord_a = start_coordinator(janitor, tmp, *FAST, "--grace-period", "3600", name="a")
    pod_a = [start_engine(janitor.spawn, tmp / f"a{i}", **knobs, coordinator=coord_a.url)
             for i in range(args.workers)]
    coord_b = start_coordinator(janitor, tmp, *FAST, name="b")
    pod_b = [start_engine(janitor.spawn, tmp / f"b{i}", **knobs) for i in range(2)]
    holder = janitor.spawn(["sleep", "3600"])
    with coord_a.client() as client:
        held = client.post("/workers", json={"pid": holder.pid, "role": "holder"}).json()
        client.post(f"/workers/{held['id']}/report", json={"inflight": 1})
    wait_for(lambda: sum(w["connected"] for w in coord_a.status()["workers"]) == args.workers,
             what="pod A registered", timeout=120)
    router = start_router(janitor, tmp, pod_a, coord_a, pod_b, coord_b, "continue")
    observer = Observer(janitor, coord_a.url)
    # 2. The continuous load.
    stop = asyncio.Event()
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0),
                             limits=httpx.Limits(max_connections=streams + 16))
    load = [asyncio.create_task(client_loop(http, router, i, stop, args.push_tokens))
            for i in range(streams)]
    result = PushResult(reader, streams)
    engines = {e.pid for e in pod_a}
    host, port = urlsplit_hostport(coord_a.url)
    for _ in range(args.push_rounds):
        # 3. One round: all R streams on pod A, drain, collect, abort.
        await wait_streams_on(http, pod_a, streams)
        before = observer.count
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = b'{"wait": false}'
        t0 = time.time()
        sock.sendall(b"POST /drain HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        started_at = (await asyncio.to_thread(read_answer, sock))["drain"]["started_at"]

        def notified() -> list[dict[str, Any]] | None:
            workers = [w for w in coord_a.status()["workers"] if w["pid"] in engines]
            return None if any(w["notified_at"] is None for w in workers) else workers

        # Read the workers' notified_at only once the push is surely over: polling /status
        # meanwhile would compete for the CPUs with the very wake-ups being timed.
        await asyncio.sleep(0.3)
        workers = await asyncio.to_thread(wait_for, notified, what="every worker notified",
                                          interval=0.05)
        times = [w["notified_at"] for w in workers]
        for w in workers:
            if w.get("pushed_at") is not None:
                result.written_ms.append((w["pushed_at"] - started_at) * 1000)
                result.written_to_set_ms.append((w["notified_at"] - w["pushed_at"]) * 1000)
        result.shutdown_ms += [(at - t0) * 1000 for at in times]
        result.push_ms += [(at - started_at) * 1000 for at in times]
        result.call_to_start_ms.append((started_at - t0) * 1000)
        def handed_back(before: int = before) -> bool:
            return observer.count >= before + streams

        await asyncio.to_thread(wait_for, handed_back, what="handoffs seen")
        result.handoff_ms += [(at - t0) * 1000 for at in observer.visible_at(before, streams)]
        with coord_a.client() as client:
            client.delete("/drain").raise_for_status()
        result.rounds += 1
    stop.set()
    await asyncio.gather(*load, return_exceptions=True)
    await http.aclose()
    return result


async def client_loop(http: httpx.AsyncClient, router: str, i: int, stop: asyncio.Event,
                      max_tokens: int) -> None:
    """One client: a stream through the router, then the next, until ``stop``."""
    n = 0
    while not stop.is_set():
        body = {"prompt": f"push {i} {n}", "max_tokens": max_tokens, "stream": True}
        async with http.stream("POST", f"{router}/v1/completions", json=body,
                               headers={"X-Request-Id": f"c{i}-{n}"}) as resp:
            async for _ in resp.aiter_lines():
                if stop.is_set():
                    break
        n += 1


async def wait_streams_on(http: httpx.AsyncClient, pod: list[EngineHandle], n: int) -> None:
    """Until the engines of ``pod`` hold ``n`` requests in flight together."""
    while True:
        answers = await asyncio.gather(*(http.get(f"{e.url}/health") for e in pod))
        if sum(a.json()["inflight"] for a in answers) >= n:
            return
        await asyncio.sleep(0.05)


def push_report(results: list[PushResult], args: argparse.Namespace) -> str:
    lines = [f"repeated drains: {args.workers} workers, {args.push_rounds} rounds each, "
             f"streams of {args.push_tokens} tokens", "",
             f"{'reader':<8}{'streams':>8}{'samples':>9}  {'shutdown_event set ms':>24}"
             f"  {'after drain start ms':>22}  {'handoff visible ms':>22}",
             f"{'':<8}{'':>8}{'':>9}  {'p50 / p99 / max':>24}  {'p50 / p99':>22}"
             f"  {'p50 / p99 (n)':>22}"]
    for r in results:
        hand = (f"{pct(r.handoff_ms, .5):.1f} / {pct(r.handoff_ms, .99):.1f} "
                f"({len(r.handoff_ms)})" if r.handoff_ms else "-")
        lines.append(
            f"{r.reader:<8}{r.streams:>8}{len(r.shutdown_ms):>9}  "
            f"{pct(r.shutdown_ms, .5):>7.2f} / {pct(r.shutdown_ms, .99):.2f} / "
            f"{max(r.shutdown_ms or [0]):.2f}  "
            f"{pct(r.push_ms, .5):>10.2f} / {pct(r.push_ms, .99):.2f}  {hand:>22}")
    lines += ["", "breakdown (ms, p50 / p99 / max): call -> coordinator drain start | "
              "drain start -> line written by the coordinator | written -> shutdown_event set"
              " | drain start -> line read by the worker | line read -> shutdown_event set"]
    for r in results:
        parts = [f"{pct(v, .5):.2f} / {pct(v, .99):.2f} / {max(v or [0]):.2f}"
                 for v in (r.call_to_start_ms, r.written_ms, r.written_to_set_ms,
                           r.received_ms, r.hop_ms)]
        lines.append(f"{r.reader:<8}{r.streams:>8}  " + "  |  ".join(parts)
                     + f"  sources {dict(sorted(r.sources.items()))}")
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

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
