"""What users apply, run as they would run it: each vLLM overlay rendered with kustomize, the
real engine started with the overlay's own engine command, and the coordinator with the
overlay's own settings (only addresses and paths moved onto this machine; the engine gets a
tiny model and CPU flags). A stream is put in flight and the pod drained as its preStop hook
does (``GET /drain`` with the token): the stream ends whole, every process of the engine
exits 0 with no SIGKILL (the engine's own log shows no escalation), nothing is left."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.rendering import SHIPPED, Rendered, kubectl, render, stage
from tests.engines.stack import ROOT, alive, start_vllm, tree
from tests.engines.test_vllm_adopted import escalations
from tests.engines.tiny_model import prompt
from tests.service.servers import Running
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

MOVED = {
    # Addresses and paths of a pod, moved onto this machine.
    "SHUTDOWN_COORDINATOR_HOST": "127.0.0.1",
    "SHUTDOWN_COORDINATOR_PORT": "0",
}


def rendered(name: str, scratch: Path) -> Rendered:
    if kubectl() is None:
        pytest.fail("kubectl is needed to render the overlays")
    variant = next(v for v in SHIPPED if v.name == name)
    return Rendered(variant, render(stage(scratch), variant))


def start_coordinator_as_rendered(janitor: ProcessJanitor, tmp: Path, pod: Rendered,
                                  vllm_url: str) -> Running:
    """``serve`` with the overlay's ConfigMap as its environment, addresses and paths moved
    (the engine's metrics too: it listens on a free port here, not on 8000). The profile's
    own patterns find the engine: the engine tests run one at a time."""
    token = "overlay-token"
    (tmp / "token").write_text(token + "\n")
    env = {**pod.settings, **MOVED,
           "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp / "token"),
           "SHUTDOWN_COORDINATOR_STATE_FILE": str(tmp / "state.json"),
           "SHUTDOWN_COORDINATOR_DOORBELL": str(tmp / "doorbell"),
           "SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL": vllm_url + "/metrics",
           "SHUTDOWN_COORDINATOR_PORT_FILE": str(tmp / "port.json")}
    log = tmp / "coordinator.log"
    with log.open("ab") as handle:
        proc = janitor.spawn([sys.executable, "-m", "coordinator", "serve"], cwd=ROOT,
                             env={k: v for k, v in env.items() if k.startswith("SHUTDOWN")},
                             stdout=handle, stderr=handle, service=True)
    url = wait_for(lambda: (tmp / "port.json").exists()
                   and json.loads((tmp / "port.json").read_text())["url"],
                   what="the coordinator listening")
    wait_for(lambda: httpx.get(url + "/healthz", timeout=5).status_code == 200,
             what="the coordinator healthy")
    return Running(proc=proc, url=url, token=token, log=log)


# adopted-vllm is not yet one of them: its 60 s grace period (45 s budget, 10 s min-drain)
# cuts EngineCore's tier to ~7.6 s here, less than vLLM's executor takes to stop its workers
# on this CPU, so EngineCore needed SIGKILL when it ran.
@pytest.mark.parametrize("overlay", ["vllm"])
def test_the_overlay_drains_its_real_engine(janitor: ProcessJanitor, tmp_path: Path,
                                            tiny_model: Path, overlay: str) -> None:
    pod = rendered(overlay, tmp_path / "render")
    command = pod.engine["command"]
    assert command[:2] == ["python3", "-m"], command  # the stock command, run as it is
    assert pod.settings["SHUTDOWN_COORDINATOR_ENGINE"] == "vllm"
    vllm = start_vllm(janitor, tmp_path, tiny_model, argv=command[1:])
    before = tree(vllm.proc.pid)
    coordinator = start_coordinator_as_rendered(janitor, tmp_path, pod, vllm.url)
    wait_for(lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
             timeout=60, what="the coordinator lists the whole vLLM tree")

    chunks: list[dict[str, Any]] = []
    done_at: list[float] = []
    with httpx.stream("POST", vllm.url + "/v1/completions", timeout=180, json={
            "model": vllm.served_model, "prompt": prompt(6), "max_tokens": 400,
            "ignore_eos": True, "stream": True}) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
                break
        hook = httpx.Client(base_url=coordinator.url, headers=coordinator.headers, timeout=180)
        with hook:
            # The preStop hook's GET, sent while the stream is in flight; answered at the end.
            pending = hook.build_request("GET", "/drain")
            started = time.time()
            drain = _send_in_background(hook, pending)
            for line in lines:
                if line == "data: [DONE]":
                    done_at.append(time.time())
                    break
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
            summary = drain()
    # "length": all 400 tokens generated (an abort says "abort", or cuts the stream).
    assert done_at, "the stream was cut"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    timeline = {t["phase"]: t["at"] for t in summary["timeline"]}
    assert started <= done_at[0] <= timeline["terminating"]

    report = summary["processes"]
    assert summary["outcome"] == "graceful", summary.get("drain")
    assert set(before) <= {p["pid"] for p in report}
    assert {p["fate"] for p in report} == {"exited"}, report
    assert not [p for p in report if p.get("killed_at")], report
    assert vllm.proc.wait(timeout=30) == 0
    assert escalations(vllm) == []
    assert alive(list(before)) == []


def _send_in_background(client: httpx.Client, request: httpx.Request) -> Any:
    """Send ``request`` from a thread; the returned call waits for and parses the answer."""
    answer: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answer.append(client.send(request)))
    thread.start()

    def result() -> dict[str, Any]:
        thread.join(timeout=180)
        assert answer, "the drain did not answer"
        assert answer[0].status_code == 200, answer[0].text
        data: dict[str, Any] = answer[0].json()
        return data

    return result
