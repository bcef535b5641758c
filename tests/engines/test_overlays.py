"""What users apply, run as they would run it: each vLLM overlay rendered with kustomize, the
real engine started with the overlay's own engine command, and the coordinator with the
overlay's own settings (only addresses and paths moved onto this machine; the engine gets a
tiny model and CPU flags). A stream is put in flight and the pod drained as its preStop hook
does (the rendered hook command, then the kubelet's SIGTERM to the main process once it
returned): the stream ends whole, every process of the engine exits 0 with no SIGKILL (the
engine's own log shows no escalation), nothing is left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.rendering import DRAIN_HOOK, SHIPPED, Rendered, kubectl, render, stage
from tests.engines.stack import ROOT, Vllm, alive, start_vllm, tree
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
                                  vllm: Vllm) -> Running:
    """``serve`` with the overlay's ConfigMap, the engine's metrics moved too (it listens on
    a free port here, not on 8000). The profile's own patterns find the engine, confined to
    its tree: in a pod the PID namespace is the boundary, on this host any other vLLM (a
    container's, another test's) would match them too."""
    return start_coordinator_with(janitor, tmp, {
        **pod.settings, "SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL": vllm.url + "/metrics",
        "SHUTDOWN_COORDINATOR_CONFINE_TO_PID": str(vllm.proc.pid)})


def start_coordinator_with(janitor: ProcessJanitor, tmp: Path,
                           settings: dict[str, str]) -> Running:
    """``serve`` with ``settings`` as its environment (an overlay's ConfigMap), addresses and
    paths moved onto this machine (``MOVED``, the token, state file, doorbell, port file)."""
    token = "overlay-token"
    (tmp / "token").write_text(token + "\n")
    env = {**settings, **MOVED,
           "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp / "token"),
           "SHUTDOWN_COORDINATOR_STATE_FILE": str(tmp / "state.json"),
           "SHUTDOWN_COORDINATOR_DOORBELL": str(tmp / "doorbell"),
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


def hook_command(pod: Rendered, coordinator: Running, tmp: Path) -> list[str]:
    """The engine container's rendered preStop command, run here: its interpreter and the
    mounted hook's path moved onto this machine, every argument as rendered."""
    command = list(pod.engine["lifecycle"]["preStop"]["exec"]["command"])
    assert command[0] == "python3"
    assert command[1].endswith("/drain_hook.py")
    token = tmp / "hook-token"
    token.write_text(f"{coordinator.token}\n")
    return [sys.executable, str(DRAIN_HOOK), *command[2:], "--url", coordinator.url,
            "--token-file", str(token)]


@pytest.mark.parametrize("overlay", ["vllm", "adopted-vllm"])
def test_the_overlay_drains_its_real_engine(janitor: ProcessJanitor, tmp_path: Path,
                                            tiny_model: Path, overlay: str) -> None:
    """1. the overlay rendered; the real vLLM started with its engine command, the coordinator
    with its settings; 2. a 400-token stream in flight, the rendered preStop command runs;
    3. it returns 0 as the kill starts: the overlay sets vLLM's --shutdown-timeout, so its
    profile signals the API server (the container's main process) first and alone, and that
    signal is left to the kubelet; 4. the test, as the kubelet, sends it; 5. the stream ended
    whole before the kill, the API server stopped EngineCore and its Worker itself, every
    process exited 0 with no SIGKILL (the engine's log shows no escalation), nothing is
    left."""
    pod = rendered(overlay, tmp_path / "render")
    command = pod.engine["command"]
    assert command[:2] == ["python3", "-m"], command  # the stock command, run as it is
    assert pod.settings["SHUTDOWN_COORDINATOR_ENGINE"] == "vllm"
    # the overlay's own flags, but those naming the model and the address (moved here)
    kept = [a for a in pod.engine.get("args", [])
            if not a.startswith(("--model", "--host", "--port"))]
    assert "--shutdown-timeout=30" in kept
    # The container's own environment (vLLM's shutdown waits), as the kubelet gives it.
    container_env = {e["name"]: e["value"] for e in pod.engine.get("env", []) if "value" in e}
    vllm = start_vllm(janitor, tmp_path, tiny_model, argv=[*command[1:], *kept],
                      extra_env=container_env)
    before = tree(vllm.proc.pid)
    coordinator = start_coordinator_as_rendered(janitor, tmp_path, pod, vllm)
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
        # The preStop hook, started while the stream is in flight.
        started = time.time()
        hook = janitor.spawn(hook_command(pod, coordinator, tmp_path), stdout=subprocess.PIPE,
                             text=True)
        for line in lines:
            if line == "data: [DONE]":
                done_at.append(time.time())
                break
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    out, _ = hook.communicate(timeout=300)
    assert hook.returncode == 0, out
    assert f"main left to the kubelet's SIGTERM: {vllm.proc.pid}(" in out
    # vLLM's profile with --shutdown-timeout: the API server's tier is the first, so the hook
    # returns as the kill starts, the whole tree still running, nothing signalled yet.
    assert alive(list(before)) == sorted(before)
    vllm.proc.send_signal(signal.SIGTERM)  # the kubelet's, once the hook returned
    with coordinator.client(timeout=180) as client:
        summary = client.get("/drain").json()  # joins the drain; answers at its end

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
    # the API server stopped its engine itself: the coordinator signalled neither EngineCore
    # nor its Worker (what outlives the API server, e.g. the resource tracker, it may)
    engine = [p for p in report if p["name"].startswith("VLLM::")]
    assert len(engine) >= 2, report
    assert not [p for p in engine if p.get("signalled_at")], report
    assert next(p for p in report if p["pid"] == vllm.proc.pid)["signalled_at"]
    assert vllm.proc.wait(timeout=30) == 0
    assert escalations(vllm) == []
    assert alive(list(before)) == []
