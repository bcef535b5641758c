"""64 streams over 3 pods through the reference router; one pod drains (or dies) mid-stream.

Pod 0's engine holds every stream after its first ``MIN_TOKENS`` tokens until it is handed
back (``--hold-after-tokens``): the drain, the SIGTERM or the crash always lands mid-stream,
however slow the machine, and no test races the token clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx

from tests.kill.helpers import alive
from tests.migration.stack import (
    Load,
    Pod,
    assert_true_to_the_records,
    start_pod,
    start_router,
    summary_is_graceful,
)
from tests.support.processes import ProcessJanitor, wait_for

STREAMS = 64
MAX_TOKENS = 40
MIN_TOKENS = 3


def _pods(janitor: ProcessJanitor, tmp: Path, *, with_coordinator: bool = True,
          **engine: object) -> list[Pod]:
    """Three pods; pod 0's engine holds its streams after ``MIN_TOKENS`` tokens. Pods 1 and 2
    are scenery: the janitor stops their engines at the end (a stock engine's SIGTERM
    SIGKILLs its tree, itself included); pod 0's must be gone by then."""
    pods = [start_pod(janitor, tmp, f"pod{i}", with_coordinator=with_coordinator,
                      **({"hold_after_tokens": MIN_TOKENS} if i == 0 else {}), **engine)
            for i in range(3)]
    code = 0 if engine.get("graceful_main", True) else -signal.SIGKILL
    for pod in pods[1:]:
        janitor.service(pod.engine.proc, exit_code=code)
    return pods


async def test_drain_mid_stream_loses_nothing(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start 3 pods (coordinator + simulated engine with worker_client) and the router;
       pod 0 holds its streams after 3 tokens until they are handed back.
    2. Open 64 concurrent streams of 40 tokens through the router.
    3. Once every stream has 3 tokens, drain pod 0 with GET /drain, as the kubelet would.
    4. Every stream completes with exactly the expected tokens; pod 0 handed back every
       stream it held (none could finish there), the router continued each one, and
       acknowledged every one of them (pod 0's coordinator counts them all acknowledged).
    5. Pod 0's tree ended gracefully, as its processes' own records say (each finished its
       cleanup and exit code) and the summary agrees, nothing of it runs, and its main
       process exited 0 (its wait status)."""
    pods = _pods(janitor, tmp_path)
    router = start_router(janitor, tmp_path, pods)
    load = Load(router, STREAMS, MAX_TOKENS, MIN_TOKENS)
    running = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), 120)
    assert pods[0].coordinator is not None
    drain = await asyncio.to_thread(
        httpx.get, f"{pods[0].coordinator.url}/drain", timeout=60)
    streams = await asyncio.wait_for(running, 120)

    broken = [(s.prompt, len(s.tokens), s.error) for s in streams if not s.exact]
    assert not broken, broken
    assert drain.status_code == 200, drain.text
    summary = drain.json()
    assert summary["phase"] == "done"
    assert not summary_is_graceful(summary, pods[0].engine.pid)
    assert summary["outcome"] == "graceful"
    main_code = pods[0].engine.proc.wait(timeout=30)
    assert main_code == 0
    assert_true_to_the_records(summary, pods[0].engine, main_code)
    stats = (await asyncio.to_thread(httpx.get, f"{router}/stats")).json()
    assert stats["handed_back"] >= 1, stats
    assert stats["failed"] == 0, stats
    assert stats["broken"] == 0, stats
    assert stats["continued"] == stats["handed_back"], stats
    status = pods[0].coordinator.status()
    assert status["migrations"] == [], status["migrations"]
    assert status["migration_counts"]["acked"] == stats["handed_back"], (
        status["migration_counts"], stats)


async def test_plain_sigterm_without_coordinator_loses_streams(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Start 3 stock engines (no coordinator; SIGTERM SIGKILLs the engine's tree) behind a
       router without migration (it re-issues a broken request from scratch); pod 0 holds
       its streams after 3 tokens.
    2. Open the same 64 streams; once each has 3 tokens, SIGTERM pod 0's engine.
    3. The exact-tokens check fails for the streams pod 0 held (they restart: duplicates),
       and the engine's main process died by SIGKILL: the check can fail."""
    pods = _pods(janitor, tmp_path, with_coordinator=False, graceful_main=False)
    router = start_router(janitor, tmp_path, pods, "--resume", "restart")
    load = Load(router, STREAMS, MAX_TOKENS, MIN_TOKENS)
    running = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), 120)
    os.kill(pods[0].engine.pid, signal.SIGTERM)
    streams = await asyncio.wait_for(running, 120)

    assert any(not s.exact for s in streams)
    assert pods[0].engine.proc.wait(timeout=30) == -signal.SIGKILL
    stats = (await asyncio.to_thread(httpx.get, f"{router}/stats")).json()
    assert stats["broken"] >= 1, stats


async def test_engine_crash_mid_drain(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. 3 pods and the router; 64 streams (pod 0 holds its own after 3 tokens); once each
       has 3 tokens, start pod 0's drain (POST /drain, wait=false).
    2. Right away, SIGKILL pod 0's engine main process (a crash during the drain; its
       children die through PDEATHSIG).
    3. Every stream still completes exactly (handed back or broken, the router continues
       it), and the drain still ends with nothing left running: the summary lists every
       process of pod 0's engine once, none running or survived, and /proc agrees; the main
       process died of SIGKILL (its wait status), and the summary says so and judges the
       drain ``signalled``."""
    pods = _pods(janitor, tmp_path)
    router = start_router(janitor, tmp_path, pods)
    load = Load(router, STREAMS, MAX_TOKENS, MIN_TOKENS)
    running = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), 120)
    coordinator = pods[0].coordinator
    assert coordinator is not None
    # A scan has listed the engine's whole tree (a child started after the last scan that
    # dies with the crash and is reaped before the next one leaves no trace anywhere).
    pids = sorted(p.pid for p in pods[0].engine.processes)
    await asyncio.to_thread(wait_for, lambda: sorted(
        p["pid"] for p in httpx.get(f"{coordinator.url}/status", timeout=30).json()["processes"]
    ) == pids, what="pod 0's tree listed")
    started = await asyncio.to_thread(
        httpx.post, f"{coordinator.url}/drain", json={"wait": False}, timeout=30)
    assert started.status_code == 202, started.text
    os.kill(pods[0].engine.pid, signal.SIGKILL)
    drain = await asyncio.to_thread(httpx.get, f"{coordinator.url}/drain", timeout=60)
    streams = await asyncio.wait_for(running, 120)

    broken = [(s.prompt, len(s.tokens), s.error) for s in streams if not s.exact]
    assert not broken, broken
    summary = drain.json()
    assert summary["phase"] == "done"
    assert not [p for p in summary["processes"] if p["fate"] in ("running", "survived")]
    engine = pods[0].engine
    pids = sorted(p.pid for p in engine.processes)
    assert sorted(p["pid"] for p in summary["processes"]) == pids
    assert not [pid for pid in pids if alive(pid)]
    assert engine.proc.wait(timeout=30) == -signal.SIGKILL
    main = next(p for p in summary["processes"] if p["pid"] == engine.pid)
    assert main["exit_code"] == -signal.SIGKILL, main
    assert summary["outcome"] == "signalled", summary["drain"]["causes"]
