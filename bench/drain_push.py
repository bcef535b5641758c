"""Repeated drains under a continuous load, for the percentiles one drain cannot give
(``bench/drain.py --push-rounds N``).

Pod A holds W simulated engines registered with its coordinator, under R streams through the
reference router (each client starts its next stream when one ends). Pod A is drained and
aborted N times per event reader of the engines (``loop``: the worker client reads its stream
on the engine's loop; ``thread``: a reader thread). Each round waits until all R streams run
on pod A, sends the drain, then collects each worker's ``notified_at`` (when its
``shutdown_event`` was set, reported by the worker client), ``pushed_at`` (when the
coordinator wrote the drain line), the workers' drain notices (written by the bench's drain
observer, ``bench/worker_timings.py``), and each handoff's first sight by the observer
process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import worker_timings
from bench.drain_rig import pct, read_answer, slice_note, start_router, urlsplit_hostport
from bench.handoff_observer import Observer
from devstack.sim.launcher import EngineHandle, start_engine
from tests.service.servers import FAST, hold_drains, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from worker_client._settings import DRAIN_OBSERVER_ENV, EVENT_READER_ENV


@dataclass
class PushResult:
    """The samples of every round for one event reader and stream count."""

    reader: str
    streams: int
    rounds: int = 0
    shutdown_ms: list[float] = field(default_factory=list)
    """From the drain call to each worker's shutdown_event set (every round)."""
    push_ms: list[float] = field(default_factory=list)
    """From the coordinator's drain start to each shutdown_event set."""
    handoff_ms: list[float] = field(default_factory=list)
    not_in_flight: int = 0
    """Streams counted on pod A that ended before the drain reached them (not handed back)."""
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
    """How the workers learnt of each drain: doorbell (the coordinator's pipe), push (the
    drain line), hello (a stream opened during the drain), register."""


async def run_push(args: argparse.Namespace, tmp: Path, reader: str, streams: int,
                   ) -> PushResult:
    """``args.push_rounds`` drain/abort rounds with ``streams`` streams, the engines reading
    their event streams the ``reader`` way."""
    # The engines inherit these: their reader, and the bench's drain observer.
    os.environ[EVENT_READER_ENV] = reader
    timings = tmp / f"timings-{reader}-{streams}.ndjson"
    os.environ[DRAIN_OBSERVER_ENV] = worker_timings.OBSERVER
    os.environ[worker_timings.PATH_ENV] = str(timings)
    janitor = ProcessJanitor()
    try:
        result = await _run_push(janitor, args, tmp / f"push-{reader}-{streams}", reader,
                                 streams)
    finally:
        janitor.close()
        for name in (EVENT_READER_ENV, DRAIN_OBSERVER_ENV, worker_timings.PATH_ENV):
            os.environ.pop(name, None)
    add_timings(result, timings)
    if args.keep_timings:
        _keep(timings, Path(args.keep_timings))
    return result


def _keep(timings: Path, folder: Path) -> None:
    if timings.exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(timings, folder / timings.name)


def add_timings(result: PushResult, path: Path) -> None:
    """The workers' per-drain notices (``bench/worker_timings.py``): where the time between
    the coordinator's drain start and shutdown_event goes, and how each drain was learnt."""
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
    hold_drains(coord_a, janitor.spawn(["sleep", "3600"]).pid)
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
        made_before = coord_a.status()["migration_counts"]["handed_back"]
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = b'{"wait": false}'
        t0 = time.time()
        sock.sendall(b"POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
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
        # The handoffs this drain made, from the coordinator once pod A holds nothing: a
        # stream that ended between the count above and the drain's start was not handed
        # back, and the observer must not be waited on for it.
        await wait_pod_empty(http, pod_a)
        made = coord_a.status()["migration_counts"]["handed_back"] - made_before
        result.not_in_flight += streams - made

        def handed_back(before: int = before, made: int = made) -> bool:
            return observer.count >= before + made

        await asyncio.to_thread(wait_for, handed_back, what="handoffs seen")
        result.handoff_ms += [(at - t0) * 1000 for at in observer.visible_at(before, made)]
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


STREAMS_HELD_WITHIN_S = 120.0


async def held_by(http: httpx.AsyncClient, pod: list[EngineHandle]) -> int:
    """Requests the engines of ``pod`` hold in flight together, as their ``/health`` says."""
    answers = await asyncio.gather(*(http.get(f"{e.url}/health") for e in pod))
    return sum(a.json()["inflight"] for a in answers)


async def wait_held(http: httpx.AsyncClient, pod: list[EngineHandle], done: Callable[[int], bool],
                    what: str) -> None:
    """Until ``done(held)`` for the requests ``pod`` holds; a bench whose one client process
    cannot keep its streams going (a loaded machine), or whose pod never empties, stops with
    what it saw instead of waiting for good."""
    deadline = time.monotonic() + STREAMS_HELD_WITHIN_S
    seen: list[int] = []
    while not done(held := await held_by(http, pod)):
        seen.append(held)
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{what}: not in {STREAMS_HELD_WITHIN_S:.0f} s (held {min(seen)}-{max(seen)}; "
                f"load average {os.getloadavg()[0]:.1f}); run it on a quiet machine")
        await asyncio.sleep(0.05)


async def wait_pod_empty(http: httpx.AsyncClient, pod: list[EngineHandle]) -> None:
    """Until no engine of ``pod`` holds a request (each handed its streams back)."""
    await wait_held(http, pod, lambda held: held == 0, "pod A emptied after the drain")


async def wait_streams_on(http: httpx.AsyncClient, pod: list[EngineHandle], n: int) -> None:
    """Until the engines of ``pod`` hold ``n`` requests in flight together."""
    await wait_held(http, pod, lambda held: held >= n,
                    f"pod A holding {n} streams at once from one client process")


def push_report(results: list[PushResult], args: argparse.Namespace) -> str:
    """The percentile table and the breakdown of where the time goes."""
    lines = [f"repeated drains: {args.workers} workers, {args.push_rounds} rounds each, "
             f"streams of {args.push_tokens} tokens{slice_note(args)}", "",
             f"{'reader':<8}{'streams':>8}{'samples':>9}  {'shutdown_event set ms':>24}"
             f"  {'after drain start ms':>22}  {'handoff visible ms':>22}",
             f"{'':<8}{'':>8}{'':>9}  {'p50 / p99 / max':>24}  {'p50 / p99':>22}"
             f"  {'p50 / p99 (n)':>22}"]
    for r in results:
        hand = (f"{pct(r.handoff_ms, .5):.1f} / {pct(r.handoff_ms, .99):.1f} "
                f"({len(r.handoff_ms)})" if r.handoff_ms else "-")
        if r.not_in_flight:
            hand += f", {r.not_in_flight} ended first"
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
