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

The coordinator runs with the overlay's rendered ConfigMap (``--engine dynamo``, no engine
metrics URL: no in-flight probe), confined to the worker's PID in place of the pod's PID
namespace (a second worker runs on this machine). Dynamo's frontend (elsewhere in a cluster)
runs with ``--migration-limit`` as docs/engines.md describes. A stream is put in flight on the
worker through the frontend, a second, plain worker joins (so that new requests have somewhere
to go, as beside the other replicas of a cluster), and the pod is drained as Kubernetes does:
the rendered preStop command, then the kubelet's SIGTERM to the worker (the container's main
process) once the hook returned.

What happens, read from Dynamo's code and measured here: nothing holds the drain past its
min-drain, so the hook returns as the kill starts, with the stream still in flight. At the
kubelet's SIGTERM the mocker's handler calls ``runtime.shutdown()`` at once
(``mocker/main.py``: no discovery grace period, unlike ``dynamo.vllm``'s
``graceful_shutdown_with_discovery``): the runtime withdraws the worker from discovery, so the
frontend sends new requests to the other worker, and waits for the request in flight
("Waiting for inflight requests to complete"); the stream ends whole on the worker that had it
and the worker exits 0 within its tier.
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
from devstack.routers import free_port, log_tail
from tests.deploy.rendering import Rendered
from tests.engines.stack import (
    DYNAMO_START_S,
    LOOPBACK_ENV,
    alive,
    engine_python,
    http_ok,
    spawn_logged,
    tree,
    wait_http,
)
from tests.engines.test_overlays import hook_command, rendered, start_coordinator_with
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

MAX_TOKENS = 800
SPEEDUP = "0.25"
"""The mocker's pace: about 40 tokens a second here, so 800 tokens keep the stream in flight
while the second worker joins, the hook returns and the worker has its SIGTERM, and end well
within the root's 60 s tier."""
FIRST_CHUNKS = 5
NEW_REQUESTS = 2
"""Short requests sent through the frontend once the worker logged its wait for the stream."""
GRACEFUL = "Received shutdown signal, shutting down DistributedRuntime instances"
WAITING = "Waiting for inflight requests to complete"
COMPLETED = "All inflight requests completed"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SELECTED = re.compile(r"Selected worker .*?worker_id=(\d+)")


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
    etcd and NATS addresses replaced by file discovery (in ``tmp``, shared by every worker
    started with the same ``tmp``) and loopback planes."""
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


def start_frontend(janitor: ProcessJanitor, env: dict[str, str], log: Path
                   ) -> tuple[subprocess.Popen[Any], str]:
    """Dynamo's frontend on the workers' file discovery, ``--migration-limit 3``; its URL."""
    url = f"http://127.0.0.1:{free_port()}"
    frontend = spawn_logged(
        janitor,
        [str(engine_python("dynamo")), "-m", "dynamo.frontend", "--discovery-backend", "file",
         "--migration-limit", "3", "--http-host", "127.0.0.1", "--http-port",
         url.rsplit(":", 1)[1]],
        log, env={**LOOPBACK_ENV, "DYN_FILE_KV": env["DYN_FILE_KV"], "DYN_LOG": "info",
                  "HOME": env["HOME"]})
    janitor.service(frontend)  # scenery: it must still stop cleanly on SIGTERM
    return frontend, url


def served_by(url: str, request_id: str | None = None) -> int | None:
    """The worker a short completion through the frontend was answered by (None: failed)."""
    headers = {"x-request-id": request_id} if request_id else {}
    try:
        answer = httpx.post(url + "/v1/completions", timeout=30, headers=headers, json={
            "model": "tiny", "prompt": prompt(3), "max_tokens": 2,
            "nvext": {"extra_fields": ["worker_id"]}})
    except httpx.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    worker = ((answer.json().get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
    return int(worker) if worker is not None else None


def routed(frontend_log: Path, request_id: str) -> list[int]:
    """The workers the frontend selected for ``request_id`` (its ``x-request-id``), in order."""
    mine = [line for line in plain(frontend_log).splitlines()
            if f'x_request_id="{request_id}"' in line and "Selected worker" in line]
    return [int(found.group(1)) for line in mine if (found := SELECTED.search(line))]


@dataclass
class Stream:
    """A streaming completion through the frontend, read in a thread. ``nvext.extra_fields``
    makes the frontend send one chunk per token, naming the worker that produced it (the
    mocker's tokens decode to no text in the tiny vocabulary, so text alone would not show
    progress)."""

    url: str
    request_id: str
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
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120,
                              headers={"x-request-id": self.request_id}) as response:
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


def test_the_dynamo_worker_overlay_drains_dynamos_own_worker_runtime(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. the overlay rendered (no engine metrics URL); Dynamo's frontend (file discovery,
       --migration-limit 3) and the worker (the overlay's command and env, moved as the module
       says); the coordinator with the overlay's settings, confined to the worker, listing it;
    2. an 800-token stream in flight on the worker through the frontend; a second, plain
       worker joins and the frontend routes to it;
    3. the rendered preStop command runs and returns 0 naming the worker's root once the
       min-drain is over, with the stream still in flight and the worker still running;
    4. the test, as the kubelet, SIGTERMs the worker; once it logged its wait for the stream,
       two short requests through the frontend; GET /drain joins the drain's end;
    5. the worker logged Dynamo's graceful shutdown once and its wait for the stream, and
       exits 0, nothing forced; the short requests went to the other worker (their answers
       and the frontend's routing); the stream ended whole, after the SIGTERM, from the
       worker that had it, routed once; the tree is gone; the summary says graceful, the root
       exited 0 by the kubelet's SIGTERM, no in-flight probe."""
    began = time.time()
    pod = rendered("dynamo-worker", tmp_path / "render")
    assert pod.settings["SHUTDOWN_COORDINATOR_ENGINE"] == "dynamo"
    assert "SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL" not in pod.settings  # no probe
    min_drain = float(pod.settings["SHUTDOWN_COORDINATOR_MIN_DRAIN_S"])
    env, system_port = worker_env(pod, tmp_path)
    metrics_url = f"http://127.0.0.1:{system_port}/metrics"

    frontend_log = tmp_path / "frontend.log"
    frontend, url = start_frontend(janitor, env, frontend_log)
    worker_log = tmp_path / "worker.log"
    worker = spawn_logged(janitor, worker_command(pod, tiny_model), worker_log, env=env)
    wait_http(metrics_url, worker, worker_log, timeout=DYNAMO_START_S,
              what="the worker's system port")

    def served() -> bool:
        if frontend.poll() is not None:
            raise AssertionError(f"frontend exited:\n{log_tail(frontend_log)}")
        if worker.poll() is not None:
            raise AssertionError(f"worker exited:\n{log_tail(worker_log)}")
        return http_ok(url + "/v1/models") and served_by(url) is not None
    wait_for(served, timeout=DYNAMO_START_S, interval=0.5,
             what="the frontend served a request from the worker")

    before = tree(worker.pid)
    assert list(before) == [worker.pid], before  # the mocker is one process
    coordinator = start_coordinator_with(janitor, tmp_path, {
        **pod.settings, "SHUTDOWN_COORDINATOR_CONFINE_TO_PID": str(worker.pid)})
    wait_for(lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
             timeout=60, what="the coordinator lists the worker's tree")
    assert coordinator.status().get("engine_inflight") is None  # no probe configured
    ready_at = time.time()

    # The stream, on the worker (the only one yet); then the second worker joins.
    stream = Stream(url, "overlay-stream")
    reader = threading.Thread(target=stream.run, daemon=True)
    reader.start()
    stream_at = time.time()
    assert stream.started.wait(60), "no streamed tokens"
    assert stream.error is None, stream.error
    assert len(stream.workers) == 1, stream.workers
    id_a = next(iter(stream.workers))
    env_b, port_b = worker_env(pod, tmp_path)
    log_b = tmp_path / "worker-b.log"
    worker_b = spawn_logged(janitor, worker_command(pod, tiny_model), log_b, env=env_b)
    janitor.service(worker_b)
    wait_http(f"http://127.0.0.1:{port_b}/metrics", worker_b, log_b, timeout=DYNAMO_START_S,
              what="the second worker's system port")
    id_b = wait_for(lambda: next((w for w in (served_by(url),) if w not in (None, id_a)), None),
                    timeout=60, interval=0.2, what="the frontend routes to the second worker")
    assert not stream.ended.is_set(), "the stream ended before the drain"

    # The preStop hook: it returns once the min-drain is over, the stream still in flight.
    assert "--main-by-kubelet" in pod.engine["lifecycle"]["preStop"]["exec"]["command"]
    hook_at = time.time()
    hook = janitor.spawn(hook_command(pod, coordinator, tmp_path), stdout=subprocess.PIPE,
                         text=True)
    out, _ = hook.communicate(timeout=60)
    returned_at = time.time()
    assert hook.returncode == 0, out
    assert f"main left to the kubelet's SIGTERM: {worker.pid}(" in out, out
    assert worker.poll() is None  # the main process waits for the kubelet
    assert not stream.ended.is_set(), "the stream ended before the hook returned"
    tokens_at_return = stream.tokens

    # The kubelet's SIGTERM; once the worker logged its wait for the stream, new requests.
    sigterm_at = time.time()
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: WAITING in plain(worker_log), timeout=15, interval=0.1,
             what="the worker waiting for its in-flight request")
    new_at = time.time()
    new_ids = [f"overlay-new-{i}" for i in range(NEW_REQUESTS)]
    new = [served_by(url, request_id) for request_id in new_ids]
    new_done_at = time.time()
    assert worker.poll() is None, "the worker exited before the new requests were answered"
    assert not stream.ended.is_set(), "the stream ended before the new requests were answered"
    with coordinator.client(timeout=120) as client:
        summary = client.get("/drain").json()  # joins the drain; answers at its end
    code = worker.wait(timeout=60)
    exited_at = time.time()
    reader.join(timeout=60)
    assert stream.ended_at is not None
    stream_end = stream.ended_at

    timeline = {t["phase"]: t["at"] for t in summary["timeline"]}
    print("drain summary:", json.dumps({k: v for k, v in summary.items() if k != "processes"}))
    print("processes:", json.dumps(summary["processes"]))
    print(f"stream: {stream.tokens} tokens ({tokens_at_return} when the hook returned), "
          f"workers {stream.workers}, finish {stream.finish}, usage {stream.usage}")
    print(f"workers: A {id_a}, B {id_b}; new requests answered by {new}")
    print(f"from the hook's start: stream start {stream_at - hook_at:.1f} s; hook returned "
          f"+{returned_at - hook_at:.1f} s (min-drain {min_drain:g} s); SIGTERM at "
          f"+{sigterm_at - hook_at:.1f} s, new requests +{new_at - hook_at:.1f}-"
          f"{new_done_at - hook_at:.1f} s, stream end +{stream_end - hook_at:.1f} s, worker "
          f"exit +{exited_at - hook_at:.1f} s ({exited_at - sigterm_at:.1f} s after its "
          f"SIGTERM); test {time.time() - began:.1f} s (start {ready_at - began:.1f} s)")

    # The drain: no probe, so it left migrating at the end of the min-drain and handed the
    # worker's root over as the kill started, the stream still in flight.
    assert summary.get("engine_inflight") is None
    assert timeline["draining"] + min_drain <= timeline["terminating"], timeline
    assert min_drain <= returned_at - hook_at
    assert timeline["terminating"] < returned_at < sigterm_at < stream_end

    # The worker: Dynamo's graceful shutdown, once, its wait for the stream; exit 0, nothing
    # forced.
    assert code == 0, log_tail(worker_log)
    log = plain(worker_log)
    assert log.count(GRACEFUL) == 1, log_tail(worker_log)  # a second signal logs it again
    assert "Runtime shutdown initiated" in log
    waiting = [line for line in log.splitlines() if WAITING in line]
    assert len(waiting) == 1, waiting
    assert "inflight_count=1" in waiting[0], waiting
    assert COMPLETED in log
    assert "Phase 3: Connections to backend services will now be disconnected" in log
    assert "Timed out waiting for inflight requests" not in log
    assert "Graceful endpoint shutdown timed out" not in log
    assert "Traceback" not in log
    assert alive(list(before)) == []
    assert stream_end <= exited_at

    # New requests after the SIGTERM, while the worker still ran and waited for its stream:
    # answered by the other worker, which the frontend selected for each, and it alone.
    assert new == [id_b] * NEW_REQUESTS, (new, id_a, id_b)
    for request_id in new_ids:
        assert routed(frontend_log, request_id) == [id_b], (request_id, id_a, id_b)

    # The stream: whole, from that one worker, routed once, nothing migrated.
    assert stream.error is None, stream.error
    assert stream.done, stream.finish
    assert stream.finish == ["length"]
    assert stream.tokens == MAX_TOKENS
    assert stream.usage is not None
    assert stream.usage["completion_tokens"] == MAX_TOKENS
    assert stream.workers == {id_a}, stream.workers
    assert routed(frontend_log, stream.request_id) == [id_a]
    frontend_text = plain(frontend_log)
    assert "Request migration enabled (limit: 3)" in frontend_text
    attempts = re.findall(r"request\.attempt=(\d+) migration\.is_retry=(\w+)", frontend_text)
    assert attempts, log_tail(frontend_log)
    assert set(attempts) == {("0", "false")}, attempts  # every request routed once
    assert "migration retry" not in frontend_text

    # The coordinator's summary agrees.
    assert summary["phase"] == "done"
    assert summary["outcome"] == "graceful", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert set(report) == set(before), report  # confined: the other worker is not its own
    assert {p["fate"] for p in report.values()} == {"exited"}, report
    assert not [p for p in report.values() if p.get("killed_at")], report
    root = report[worker.pid]
    assert (root["exit_code"], root["signal"]) == (0, "SIGTERM"), root
    assert root["detail"] == LEFT_TO_CALLER
