"""The ``dynamo-worker`` overlay, drained for real: Dynamo's own frontend and worker runtime.

The overlay runs ``python3 -m dynamo.vllm``, which needs vLLM inside Dynamo's environment (not
installable here in a sane time). ``python -m dynamo.mocker`` (ai-dynamo 1.6.1) runs the same
worker runtime (the Rust ``DistributedRuntime``: its discovery registration and withdrawal, its
request plane, its graceful shutdown that waits for in-flight requests) around a simulated
engine, so this test runs the overlay's rendered engine command with only this moved:

- ``dynamo.vllm`` → ``dynamo.mocker``, in the engine's own virtualenv;
- the model arguments (``--model=Qwen/Qwen3-0.6B`` → the tiny local model, served as ``tiny``,
  and ``--speedup-ratio`` to pace the simulated engine);
- the addresses: etcd and NATS (``ETCD_ENDPOINTS``, ``NATS_SERVER``) → file discovery
  (``--discovery-backend file``, ``DYN_FILE_KV``), Dynamo's planes on loopback, and
  ``DYN_SYSTEM_PORT`` on a free port. The overlay's other ``DYN_*`` settings are kept as
  rendered (``DYN_SYSTEM_ENABLED``, ``DYN_NAMESPACE``).

The coordinator runs with the overlay's rendered ConfigMap (``--engine dynamo``), its engine
metrics URL moved to the worker's system port; Dynamo's frontend (elsewhere in a cluster) runs
with ``--migration-limit`` as docs/engines.md describes. A stream is put in flight through the
frontend and the pod is drained as Kubernetes does: the rendered preStop command, then the
kubelet's SIGTERM to the worker (the container's main process) once the hook returned.

What happens, read from the mocker's code and measured here: once it has served a request,
the mocker exports vLLM's in-flight gauges (``vllm:num_requests_running`` and ``_waiting``) on
its system port beside the runtime's own ``dynamo_component_inflight_requests``, so the
profile's probe reads the stream (1) and holds the drain in ``migrating`` until the worker has
finished it (0): the stream ends whole on the worker that had it, nothing is migrated, and only
then does the hook return. The kubelet's SIGTERM then finds nothing in flight; the mocker's
handler calls ``runtime.shutdown()`` at once (``mocker/main.py``: no discovery grace period,
unlike ``dynamo.vllm``'s ``graceful_shutdown_with_discovery``), the frontend drops the worker
from discovery and the worker exits 0.
"""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.drain.handover import LEFT_TO_CALLER
from tests.deploy.rendering import Rendered
from tests.engines.stack import (
    DYNAMO_START_S,
    LOOPBACK_ENV,
    alive,
    engine_python,
    free_port,
    http_ok,
    log_tail,
    spawn_logged,
    tree,
    wait_http,
)
from tests.engines.test_overlays import hook_command, rendered, start_coordinator_as_rendered
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

MAX_TOKENS = 600
SPEEDUP = "0.25"
"""The mocker's pace: 600 tokens take about 11 s here, past the overlay's 5 s min-drain (so it
is the in-flight probe that holds the drain) and well within its 45 s migration share."""
FIRST_CHUNKS = 5
GRACEFUL = "Received shutdown signal, shutting down DistributedRuntime instances"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(path: Path) -> str:
    """A Dynamo log without its colour codes."""
    return ANSI.sub("", path.read_text(errors="replace"))


def system_port() -> int:
    """A free port Dynamo accepts as ``DYN_SYSTEM_PORT``: ai-dynamo 1.6.1 reads it as an i16
    ("invalid value unsigned int `58385`, expected i16"), so not the kernel's ephemeral
    range."""
    for port in random.sample(range(20000, 32768), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below 32768")


def worker_env(pod: Rendered, tmp: Path) -> tuple[dict[str, str], int]:
    """The engine container's literal ``DYN_*`` env, its system port moved to a free one; the
    etcd and NATS addresses replaced by file discovery and loopback planes."""
    rendered_env = {k: v["value"] for k, v in pod.env(pod.engine).items() if "value" in v}
    assert rendered_env["DYN_SYSTEM_ENABLED"] == "true"
    assert rendered_env["DYN_SYSTEM_PORT"] == "9090"
    assert {"ETCD_ENDPOINTS", "NATS_SERVER"} <= set(rendered_env)  # the addresses moved
    port = system_port()
    env = {k: v for k, v in rendered_env.items() if k.startswith("DYN_")}
    env.update(LOOPBACK_ENV, DYN_SYSTEM_PORT=str(port), DYN_FILE_KV=str(tmp / "discovery"),
               DYN_LOG="info", HOME=str(tmp / "home"))
    return env, port


def worker_command(pod: Rendered, model: Path) -> list[str]:
    """The overlay's engine command, ``dynamo.vllm`` → ``dynamo.mocker``, model args moved."""
    command = pod.engine["command"]
    assert command == ["python3", "-m", "dynamo.vllm"], command
    args = list(pod.engine.get("args") or [])
    assert args == ["--model=Qwen/Qwen3-0.6B"], args  # the only ones, all moved
    return [str(engine_python("dynamo")), "-m", "dynamo.mocker", "--model-path", str(model),
            "--model-name", "tiny", "--speedup-ratio", SPEEDUP, "--discovery-backend", "file"]


@dataclass
class Stream:
    """A streaming completion through the frontend, read in a thread. ``nvext.extra_fields``
    makes the frontend send one chunk per token, naming the worker that produced it (the
    mocker's tokens decode to no text in the tiny vocabulary, so text alone would not show
    progress)."""

    url: str
    tokens: int = 0
    workers: set[int] = field(default_factory=set)
    finish: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    done: bool = False
    ended_at: float | None = None
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"model": "tiny", "prompt": prompt(6), "max_tokens": MAX_TOKENS, "stream": True,
                "stream_options": {"include_usage": True},
                "nvext": {"extra_fields": ["worker_id"]}}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=120) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: {"):
                        self.take(json.loads(line[len("data: "):]))
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.ended_at = time.time()
            self.started.set()
            self.ended.set()

    def take(self, event: dict[str, Any]) -> None:
        if event.get("usage"):
            self.usage = event["usage"]
        worker = ((event.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
        if worker is not None:
            self.workers.add(int(worker))
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish.append(choice["finish_reason"])
            else:
                self.tokens += 1
        if self.tokens >= FIRST_CHUNKS:
            self.started.set()


def worker_gauge(metrics_url: str) -> float | None:
    """The runtime's own ``dynamo_component_inflight_requests`` of the generate endpoint."""
    try:
        page = httpx.get(metrics_url, timeout=2).text
    except httpx.HTTPError:
        return None
    for line in page.splitlines():
        if (line.startswith("dynamo_component_inflight_requests{")
                and 'dynamo_endpoint="generate"' in line):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_dynamo_worker_overlay_drains_dynamos_own_worker_runtime(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. the overlay rendered; Dynamo's frontend (file discovery, --migration-limit 3) and the
       worker (the overlay's command and env, moved as the module says), the coordinator with
       the overlay's settings, listing the worker's tree;
    2. a 600-token stream in flight through the frontend; the rendered preStop command runs;
       the coordinator's probe reads the stream on the worker's system port and holds the
       drain until the stream has ended whole; the hook then returns 0 naming the worker's
       root, which still runs;
    3. the test, as the kubelet, SIGTERMs the worker; GET /drain joins the drain's end;
    4. the worker exits 0 through Dynamo's graceful shutdown, one signal, nothing forced and
       nothing left in flight, in its log; the frontend dropped it from discovery and migrated
       nothing; the stream ended whole, every token from that worker; its tree is gone; the
       summary says graceful, the root exited 0 by the kubelet's SIGTERM."""
    began = time.time()
    pod = rendered("dynamo-worker", tmp_path / "render")
    assert pod.settings["SHUTDOWN_COORDINATOR_ENGINE"] == "dynamo"
    assert pod.settings["SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL"] == (
        "http://127.0.0.1:9090/metrics")  # the rendered DYN_SYSTEM_PORT
    env, system_port = worker_env(pod, tmp_path)
    metrics_url = f"http://127.0.0.1:{system_port}/metrics"

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    frontend_log = tmp_path / "frontend.log"
    frontend_env = {**LOOPBACK_ENV, "DYN_FILE_KV": env["DYN_FILE_KV"], "DYN_LOG": "info",
                    "HOME": env["HOME"]}
    frontend = spawn_logged(
        janitor,
        [str(engine_python("dynamo")), "-m", "dynamo.frontend", "--discovery-backend", "file",
         "--migration-limit", "3", "--http-host", "127.0.0.1", "--http-port", str(port)],
        frontend_log, env=frontend_env)
    janitor.service(frontend)  # scenery: it must still stop cleanly on SIGTERM

    worker_log = tmp_path / "worker.log"
    worker = spawn_logged(janitor, worker_command(pod, tiny_model), worker_log, env=env)
    wait_http(metrics_url, worker, worker_log, timeout=DYNAMO_START_S,
              what="the worker's system port")

    def served() -> bool:
        if frontend.poll() is not None:
            raise AssertionError(f"frontend exited:\n{log_tail(frontend_log)}")
        if worker.poll() is not None:
            raise AssertionError(f"worker exited:\n{log_tail(worker_log)}")
        if not http_ok(url + "/v1/models"):
            return False
        answer = httpx.post(url + "/v1/completions", timeout=30,
                            json={"model": "tiny", "prompt": prompt(3), "max_tokens": 2})
        return answer.status_code == 200
    wait_for(served, timeout=DYNAMO_START_S, interval=0.5,
             what="the frontend served a request from the worker")

    before = tree(worker.pid)
    assert list(before) == [worker.pid], before  # the mocker is one process
    coordinator = start_coordinator_as_rendered(
        janitor, tmp_path, pod, metrics_url.removesuffix("/metrics"))
    wait_for(lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
             timeout=60, what="the coordinator lists the worker's tree")
    ready_at = time.time()

    stream = Stream(url)
    reader = threading.Thread(target=stream.run, daemon=True)
    reader.start()
    assert stream.started.wait(60), "no streamed tokens"
    assert stream.error is None, stream.error
    assert not stream.ended.is_set()

    # The preStop hook, while the stream is in flight; the probe (as /status shows it) and
    # the runtime's own gauge are read as the drain goes.
    assert "--main-by-kubelet" in pod.engine["lifecycle"]["preStop"]["exec"]["command"]
    hook_at = time.time()
    hook = janitor.spawn(hook_command(pod, coordinator, tmp_path), stdout=subprocess.PIPE,
                         text=True)
    probes: list[dict[str, Any]] = []
    gauges: list[float | None] = []
    while hook.poll() is None:
        probe = coordinator.status().get("engine_inflight")
        if probe:
            probes.append(probe)
        gauges.append(worker_gauge(metrics_url))
        time.sleep(0.25)
    out, _ = hook.communicate(timeout=60)
    returned_at = time.time()
    assert hook.returncode == 0, out
    assert f"main left to the kubelet's SIGTERM: {worker.pid}(" in out, out
    assert worker.poll() is None  # the main process waits for the kubelet
    assert stream.ended.is_set(), "the hook returned with the stream still in flight"

    sigterm_at = time.time()
    worker.send_signal(signal.SIGTERM)  # the kubelet's, once the hook returned
    with coordinator.client(timeout=120) as client:
        summary = client.get("/drain").json()  # joins the drain; answers at its end
    code = worker.wait(timeout=30)
    exited_at = time.time()
    assert stream.ended_at is not None
    stream_end = stream.ended_at

    timeline = {t["phase"]: t["at"] for t in summary["timeline"]}
    print("drain summary:", json.dumps({k: v for k, v in summary.items() if k != "processes"}))
    print("processes:", json.dumps(summary["processes"]))
    print(f"stream: {stream.tokens} tokens, workers {stream.workers}, finish {stream.finish}, "
          f"usage {stream.usage}")
    print(f"hook {returned_at - hook_at:.1f} s (stream end at {stream_end - hook_at:.1f} s); "
          f"SIGTERM → worker exit {exited_at - sigterm_at:.2f} s; test "
          f"{time.time() - began:.1f} s (start {ready_at - began:.1f} s)")
    print("probe:", sorted({(p["inflight"], p["error"]) for p in probes}, key=str),
          "runtime gauge:", sorted(set(gauges), key=str))

    # The worker: exit 0 through Dynamo's graceful shutdown, once, nothing forced, nothing
    # left in flight for it to wait for.
    assert code == 0, log_tail(worker_log)
    log = plain(worker_log)
    assert log.count(GRACEFUL) == 1, log_tail(worker_log)  # a second signal logs it again
    assert "Runtime shutdown initiated" in log
    assert "Phase 3: Connections to backend services will now be disconnected" in log
    assert "Waiting for inflight requests to complete" not in log
    assert "Graceful endpoint shutdown timed out" not in log
    assert "Traceback" not in log
    assert alive(list(before)) == []

    # The frontend dropped the worker from discovery and migrated nothing.
    frontend_text = plain(frontend_log)
    assert "Removed worker set from model" in frontend_text
    assert "Request migration enabled (limit: 3)" in frontend_text
    attempts = re.findall(r"request\.attempt=(\d+) migration\.is_retry=(\w+)", frontend_text)
    assert attempts, log_tail(frontend_log)
    assert set(attempts) == {("0", "false")}, attempts  # every request routed once
    assert "migration retry" not in frontend_text

    # The stream: whole, from that one worker, ended while the drain held in migrating (past
    # its min-drain, so the probe held it), before the hook returned.
    assert stream.error is None, stream.error
    assert stream.done, stream.finish
    assert stream.finish == ["length"]
    assert stream.tokens == MAX_TOKENS
    assert stream.usage is not None
    assert stream.usage["completion_tokens"] == MAX_TOKENS
    assert len(stream.workers) == 1, stream.workers
    min_drain = float(pod.settings["SHUTDOWN_COORDINATOR_MIN_DRAIN_S"])
    assert timeline["draining"] + min_drain < stream_end <= timeline["terminating"], timeline
    assert stream_end < returned_at < sigterm_at

    # The coordinator's summary agrees.
    assert summary["phase"] == "done"
    assert summary["outcome"] == "graceful", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert set(before) <= set(report)
    assert {p["fate"] for p in report.values()} == {"exited"}, report
    assert not [p for p in report.values() if p.get("killed_at")], report
    root = report[worker.pid]
    assert (root["exit_code"], root["signal"]) == (0, "SIGTERM"), root
    assert root["detail"] == LEFT_TO_CALLER

    # The probe read the worker's vLLM-shaped gauges on its system port: the stream (1) while
    # /status was polled, then nothing (0), the reading that ended migrating (the summary
    # keeps it); the runtime's own gauge agreed.
    assert probes, "the coordinator never showed an in-flight reading"
    assert {p["url"] for p in probes} == {metrics_url}
    assert {p["error"] for p in probes} == {None}, probes
    assert 1 in {p["inflight"] for p in probes}, probes
    last = summary["engine_inflight"]
    assert (last["url"], last["inflight"], last["error"]) == (metrics_url, 0, None), last
    assert timeline["migrating"] < last["read_at"] <= timeline["terminating"], last
    assert 1.0 in gauges, gauges
