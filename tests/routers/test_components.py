"""The router components as users apply them (``components/router-smg``,
``components/router-vllm-router``), with the real router in front.

The variant is rendered with kustomize; its engine runs in its engine's shape under the
rendered command and its coordinator with the rendered settings and the coordinator
container's own environment (``tests/deploy/simulated_pod.py``), only addresses moved onto
this machine: ``http://$(POD_IP):PORT`` becomes the engine's loopback address, the rendered
router address the real router's. A second simulated engine stands for another pod behind the
same router. What the router did is judged from the router's own worker list and the
engines' own counts and records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.held_stream import alive, watch
from tests.deploy.rendering import kubectl
from tests.deploy.simulated_pod import Kubelet, start_pod
from tests.routers.stack import Router, smg_workers, start_router
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(kubectl() is None, reason="kubectl is needed to render the variants"),
    pytest.mark.timeout(180),
]

REQUESTS = 6


def _listed(router: Router, worker: str) -> str | None:
    """The worker as the router lists it: smg its status, vllm-router ``listed``; or None."""
    if router.name == "smg":
        return next((w["status"] for w in smg_workers(router) if w["url"] == worker), None)
    urls = httpx.get(f"{router.url}/list_workers", timeout=5).json()["urls"]
    return "listed" if worker in urls else None


def _completed(url: str) -> int:
    """Requests an engine completed, by its own count."""
    count: int = httpx.get(f"{url}/health", timeout=5).json()["completed"]
    return count


def _send(router: Router, count: int) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(count):
            answer = client.post(f"{router.url}/v1/completions",
                                 json={"model": "sim", "prompt": f"Prompt {i}", "max_tokens": 2})
            assert answer.status_code == 200, (answer.text, router.log_tail())


def _router_state(status: dict[str, Any], state: str) -> bool:
    routers: list[dict[str, Any]] = status["routers"]
    assert len(routers) == 1, routers
    if routers[0]["state"] == "failed":
        raise AssertionError(f"the router call failed: {routers[0]}")
    return bool(routers[0]["state"] == state)


@pytest.mark.parametrize(("variant", "router_name"), [("sglang-smg", "smg"),
                                                      ("trtllm-vllm-router", "vllm-router")])
def test_the_router_component_takes_the_pod_in_and_out_of_the_real_router(
        janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path, variant: str,
        router_name: str) -> None:
    """1. Start the router in front of another pod's engine, then the variant's pod: its
       coordinator, with the component's settings, adds the pod's engine to the router once
       the engine is healthy (the router's own list shows it).
    2. Six requests through the router: the pod's engine serves some (its own count).
    3. Delete the pod as the kubelet does (the rendered preStop hook, then SIGTERM): the
       coordinator takes the engine out of the router at the drain's start; the router's own
       list no longer offers it.
    4. Six requests through the router: every one answered, all by the other engine.
    5. The hook exits 0 and no engine process runs. Every engine process exited 0, apart from
       the stock SGLang's detokenizer, which its own main process SIGKILLs (as the real SGLang
       does): that drain is ``signalled`` and its cause names the engine's own SIGKILL."""
    other = start_sim(schedulers=1, token_interval_ms=1)
    router = start_router(router_name, janitor, tmp_path, [other.url])
    pod = start_pod(janitor, tmp_path, variant, routers={router_name: router.url})
    engine_url = pod.engine.url
    watch(pod.coordinator, lambda s: _router_state(s, "joined"), "the engine joined")
    ready = {"smg": "ready", "vllm-router": "listed"}[router_name]
    wait_for(lambda: _listed(router, engine_url) == ready, what="the router listing the engine")
    before = _completed(engine_url)
    _send(router, REQUESTS)
    assert _completed(engine_url) > before, router.log_tail()

    kubelet = Kubelet(janitor, pod)
    watch(pod.coordinator, lambda s: _router_state(s, "removed"), "the engine taken out")
    assert _listed(router, engine_url) in ("draining", None), router.log_tail()
    before_other = _completed(other.url)
    _send(router, REQUESTS)
    assert _completed(other.url) == before_other + REQUESTS

    hook_code = kubelet.finished()
    assert pod.root.wait(timeout=60) == 0, kubelet.output
    summary = watch(pod.coordinator, lambda s: s["phase"] == "done", "the drain's end")
    assert hook_code == 0, kubelet.output
    records = pod.records()
    assert sorted(records) == sorted(pod.pids)
    engine_killed = records[pod.engine.pid].get("engine_sigkilled") or []
    assert [records[pid]["role"] for pid in engine_killed] == (
        ["detokenizer"] if variant.startswith("sglang") else [])
    clean = [r for pid, r in records.items() if pid not in engine_killed]
    assert {r["exit_code"] for r in clean} == {0}, records
    assert alive(pod.pids) == []
    if engine_killed:
        assert summary["outcome"] == "signalled", summary.get("drain")
        (cause,) = summary["drain"]["causes"]
        assert "a SIGKILL sent by the engine itself, not by the coordinator" in cause
    else:
        assert summary["outcome"] == "graceful", summary.get("drain")
