"""The router adapters against the real routers (smg, vllm-router): a drain takes the pod's
engine out of the router through its own API, an abort puts it back, and a router that
cannot be reached never holds the drain.

Which engine served what comes from the engines' own counts (``/health`` ``completed``); what
the router does with the worker, from the router's own worker list; never from the
coordinator's word alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.routers import free_port
from devstack.sim import EngineHandle
from tests.kill.helpers import start_tree
from tests.routers.stack import ROUTERS, Router, smg_workers, start_router
from tests.service.servers import FAST, Running, hold_drains, register, start_coordinator
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("router_name", ROUTERS)]

REQUESTS = 6


def _served(engines: list[EngineHandle]) -> list[int]:
    """Requests each engine completed, by its own count."""
    return [httpx.get(f"{e.url}/health", timeout=5).json()["completed"] for e in engines]


def _listed(router: Router, worker: str) -> str | None:
    """The worker as the router itself lists it: smg its status (``ready``, ``draining``,
    ...), vllm-router ``listed``; None when the router does not list it."""
    if router.name == "smg":
        return next((w["status"] for w in smg_workers(router) if w["url"] == worker), None)
    urls = httpx.get(f"{router.url}/list_workers", timeout=5).json()["urls"]
    return "listed" if worker in urls else None


def _send(router: Router, count: int) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(count):
            answer = client.post(f"{router.url}/v1/completions",
                                 json={"model": "sim", "prompt": f"Prompt {i}", "max_tokens": 2})
            assert answer.status_code == 200, (answer.text, router.log_tail())


def _router_state(running: Running, state: str) -> dict[str, Any] | None:
    routers: list[dict[str, Any]] = running.status()["routers"]
    action = {"removed": "remove", "joined": "join"}.get(state, "restore")
    if state != "failed" and routers[0]["state"] == "failed" and routers[0]["action"] == action:
        raise AssertionError(f"the router call failed: {routers[0]}")
    return routers[0] if routers[0]["state"] == state else None


def _counted(router: str, action: str, result: str, times: int = 1) -> str:
    """The metrics line of ``times`` calls (labels in the exposition's order)."""
    return (f'shutdown_coordinator_router_calls_total{{action="{action}",result="{result}",'
            f'router="{router}"}} {times:.1f}')


def test_a_drain_takes_the_engine_out_and_an_abort_puts_it_back(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Start two simulated engines and the router in front of both; a coordinator with
       ``--router`` at the router and ``--router-worker-url`` the first engine; a test tree
       registered as the pod's worker with a request in flight (the drain holds in
       migrating).
    2. POST /drain: /status ``routers`` says removed; the router's own list has the engine
       draining (smg) or no longer lists it (vllm-router).
    3. Six requests through the router: the drained engine's own count does not move, the
       other engine served all six.
    4. DELETE /drain (abort): /status says restored; the router lists the engine ready again.
    5. Six requests through the router: the first engine serves again (its own count moves).
    6. Drain again, the worker reports nothing in flight: the drain ends graceful; the
       metrics count two removals and one restore, all ok."""
    engines = [start_sim(schedulers=1, token_interval_ms=1) for _ in range(2)]
    drained = engines[0].url
    router = start_router(router_name, janitor, tmp_path, [e.url for e in engines])
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60",
                                "--router", f"{router_name}={router.url}",
                                "--router-worker-url", drained)
    tree = start_tree(janitor, {}, tmp_path / "tree")
    worker_id = hold_drains(running, tree.pid)
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    removed = wait_for(lambda: _router_state(running, "removed"), what="the router told")
    assert removed["action"] == "remove"
    assert removed["error"] is None, removed
    # smg lists it draining until its settle time ends, then not at all
    out = ("draining", None) if router_name == "smg" else (None,)
    assert _listed(router, drained) in out, router.log_tail()
    before = _served(engines)
    _send(router, REQUESTS)
    after = _served(engines)
    assert after[0] == before[0], (before, after)
    assert after[1] == before[1] + REQUESTS, (before, after)

    with running.client() as client:
        assert client.delete("/drain").status_code == 200
    restored = wait_for(lambda: _router_state(running, "restored"), what="the worker restored")
    assert restored["error"] is None, restored
    ready = {"smg": "ready", "vllm-router": "listed"}[router_name]
    wait_for(lambda: _listed(router, drained) == ready, what="the router listing it again")
    before = _served(engines)
    _send(router, REQUESTS)
    after = _served(engines)
    assert after[0] > before[0], (before, after)
    assert sum(after) == sum(before) + REQUESTS

    with running.client() as client:
        report = client.post(f"/workers/{worker_id}/report", json={"inflight": 0})
        assert report.status_code == 200, report.text
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert tree.root.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful", summary
    metrics = httpx.get(f"{running.url}/metrics", timeout=5).text
    assert _counted(router_name, "restore", "ok") in metrics
    assert _counted(router_name, "remove", "ok", times=2) in metrics


def test_an_unreachable_router_does_not_hold_the_drain(
    router_name: str, janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with ``--router`` at a port nothing listens on, and a test tree
       registered as its worker.
    2. A drain ends graceful (the tree ran its own cleanup and exited 0).
    3. /status ``routers`` says the removal failed, after more than one attempt, saying the
       router was not reachable; the metrics count one failed removal."""
    closed = f"http://127.0.0.1:{free_port()}"
    running = start_coordinator(janitor, tmp_path, *FAST, "--router",
                                f"{router_name}={closed}",
                                "--router-worker-url", "http://127.0.0.1:9")
    tree = start_tree(janitor, {}, tmp_path / "tree")
    register(running, tree.pid)
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert tree.root.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful", summary
    failed = wait_for(lambda: _router_state(running, "failed"), what="the call given up")
    assert failed["action"] == "remove"
    assert failed["attempts"] > 1
    assert "not reachable" in failed["error"], failed
    metrics = httpx.get(f"{running.url}/metrics", timeout=5).text
    assert _counted(router_name, "remove", "failed") in metrics


def test_a_coordinator_started_next_to_a_new_engine_adds_it_to_the_router(
    router_name: str, janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
) -> None:
    """1. Start the router in front of one simulated engine, then a second engine and, next
       to it, a coordinator with ``--router`` and ``--router-worker-url`` the new engine (a
       pod that replaces a drained one in a rolling update).
    2. /status ``routers`` says joined; the router's own list has the new engine ready.
    3. Six requests through the router: the new engine serves some of them (its own count
       moves), the two engines all six."""
    old = start_sim(schedulers=1, token_interval_ms=1)
    router = start_router(router_name, janitor, tmp_path, [old.url])
    new = start_sim(schedulers=1, token_interval_ms=1)
    assert _listed(router, new.url) is None
    running = start_coordinator(janitor, tmp_path, *FAST, "--router",
                                f"{router_name}={router.url}", "--router-worker-url", new.url)
    joined = wait_for(lambda: _router_state(running, "joined"), what="the engine joined")
    assert (joined["action"], joined["error"]) == ("join", None), joined
    ready = {"smg": "ready", "vllm-router": "listed"}[router_name]
    wait_for(lambda: _listed(router, new.url) == ready, what="the router listing the engine")
    before = _served([old, new])
    _send(router, REQUESTS)
    after = _served([old, new])
    assert after[1] > before[1], (before, after, router.log_tail())
    assert sum(after) == sum(before) + REQUESTS
    metrics = httpx.get(f"{running.url}/metrics", timeout=5).text
    assert _counted(router_name, "join", "ok") in metrics
