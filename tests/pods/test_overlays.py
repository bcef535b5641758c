"""Every shipped overlay as a pod on podman with its engine, deleted with a stream in flight;
the same pod without the sidecar beside it (``overlays.py`` says what is changed for this
machine, and how each outcome is read).

For the overlay as shipped (``sidecar``) the goal holds, from the records: the engine
container exits 0 and the sidecar 0 (the runtime's record), the preStop hook returns 0 with
no ``FailedPreStopHook``, no process of the pod dies of a signal (the kernel's record), the
stream is whole, the pod is gone inside the grace period; and what the coordinator reports
for the engine's main process is what the runtime recorded for its container. The baselines
are run and recorded (docs/deploy.md's table), their own records held consistent.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.sim import expected_tokens
from devstack.sim.records import read_records
from tests.deploy.engine_shapes import ENV as SHAPED_ENGINE
from tests.deploy.engine_shapes import RELEASE
from tests.deploy.simulated_pod import HOLD_AT, PROMPT, SHAPES, STREAM_TOKENS
from tests.engines.stack import DYNAMO_START_S, ENGINES, LOOPBACK_ENV
from tests.engines.tiny_model import prompt
from tests.pods.conftest import PodFactory, shared_directory
from tests.pods.exits import ProcessExits
from tests.pods.images import Images, python_home
from tests.pods.kubelet import Pod
from tests.pods.overlays import (
    COORDINATOR,
    ENGINE,
    STRATEGIES,
    Machine,
    Outcome,
    StreamRead,
    delete_under_load,
    objects_of,
    read_stream,
    release_when_signalled,
    rendered,
    template,
    without_flags,
)
from tests.pods.podman import REPO, Podman
from tests.pods.spec import POD_IP
from tests.pods.state import Deletion
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.container, pytest.mark.timeout(1500)]

START_S = 900.0
"""Bound on an engine pod becoming Ready (vLLM takes minutes on a loaded 2-core machine)."""
VLLM_TOKENS = 1500
"""Tokens the vLLM stream asks for: in flight when the pod is deleted, done well within the
coordinator's migration window and vLLM's own --shutdown-timeout of 30 s. The tiny model makes
about a token a millisecond on a quiet core (a few on a loaded one): a 300-token stream could
end before a starved test thread got from its first token to the deletion."""


def engine_venv(name: str) -> Path:
    venv = ENGINES / name
    if not (venv / ".installed").exists():
        pytest.skip(f"{name} is not installed in {ENGINES}: run scripts/engines.sh {name}")
    return venv


def mounted(venv: Path, model: Path) -> dict[str, str]:
    home = python_home(venv)
    return {str(venv): str(venv), str(home): str(home), str(model): "/model"}


def vllm_machine(images: Images, model: Path) -> Machine:
    """vLLM's CPU build: the tiny model with dummy weights and a fixed KV cache (the flags
    tests/engines/stack.py starts it with), one OpenMP thread."""
    venv = engine_venv("vllm")
    return Machine(
        image=images.engine("vllm", venv),
        args=lambda args: [*without_flags(args, "--model"), "--model=/model",
                           "--served-model-name=tiny", "--load-format=dummy",
                           "--max-model-len=2048", f"--kv-cache-memory-bytes={256 * 2**20}"],
        env={"OMP_NUM_THREADS": "1"}, read_only=mounted(venv, model))


def check_outcome(outcome: Outcome, deletion: Deletion, pod: Pod) -> None:
    """What every run must hold, whatever its strategy: the records agree with each other.

    1. The engine container's exit code (the runtime's) is the kernel's wait status of its
       main process, in the runtime's convention (128 + signal).
    2. The runtime said it SIGKILLed the container exactly when the kernel says its main
       process died of SIGKILL."""
    engine = deletion.containers[ENGINE]
    main = next(p for p in outcome.processes if p.pod_pid == engine.pod_pid)
    expected = (f"killed by {signal.Signals(engine.exit_code - 128).name}"
                if engine.exit_code is not None and engine.exit_code > 128
                else f"exit {engine.exit_code}")
    assert main.end == expected, (main, engine.exit_code)
    assert (ENGINE in outcome.runtime_sigkill) == (main.end == "killed by SIGKILL"), outcome


def check_goal(outcome: Outcome, deletion: Deletion, pod: Pod) -> None:
    """The overlay as shipped: engine 0, sidecar 0, hook 0, nothing killed by a signal, the
    stream whole, inside the grace period; the coordinator's report of the engine's main
    process is the runtime's record of its container."""
    assert outcome.engine_exit == 0, pod.logs(ENGINE)[-4000:]
    assert outcome.sidecar_exit == 0, pod.logs(COORDINATOR)[-4000:]
    assert outcome.hook.startswith("exec, 0"), outcome.hook
    assert not outcome.events, outcome.events
    assert outcome.runtime_sigkill == []
    # Nothing died of a signal, but a child of the engine's own that its parent stopped with
    # SIGTERM (the drain's graceful signal; accepted for a child, DESIGN.md "Outcome").
    main_pid = deletion.containers[ENGINE].pod_pid
    assert [p for p in outcome.processes if p.end not in ("exit 0", "killed by SIGTERM")
            or (p.end != "exit 0" and p.pod_pid == main_pid)] == [], outcome.processes
    assert outcome.stream == "whole", outcome.stream_error
    assert outcome.seconds < outcome.grace_period
    drain = outcome.drain
    assert drain is not None, pod.logs(COORDINATOR)[-4000:]
    assert drain["phase"] == "done"
    assert drain["drain"]["outcome"] == "graceful", json.dumps(drain["drain"])
    check_main_process_reported_as_recorded(outcome, deletion)
    reported = {p["pid"]: p for p in drain["processes"]}
    assert reported[deletion.containers[ENGINE].pod_pid]["fate"] == "exited"
    check_every_process_reported_as_the_kernel_recorded(outcome)


def check_every_process_reported_as_the_kernel_recorded(outcome: Outcome) -> None:
    """Each process the coordinator reports with an exit code ended that way by the kernel's
    record (``exit N`` is N, ``killed by SIGX`` is -X)."""
    assert outcome.drain is not None
    reported = {p["pid"]: p for p in outcome.drain["processes"]}
    for process in outcome.processes:
        mine = reported.get(process.pod_pid)
        if mine is None or mine["exit_code"] is None:
            continue
        code = mine["exit_code"]
        kernel = (f"exit {code}" if code >= 0
                  else f"killed by {signal.Signals(-code).name}")
        assert process.end == kernel, (mine, process)


def run_overlay(pods: PodFactory, exits: ProcessExits, tmp_path: Path, overlay: str,
                strategy: str, machine: Machine, body: dict[str, Any],
                port: int) -> tuple[Outcome, Deletion, Pod]:
    pod_manifest = rendered(overlay, tmp_path / "render")
    pod = pods(template(pod_manifest, machine, strategy), objects_of(pod_manifest),
               name=f"{overlay}-{strategy}")
    pod.start(ready_timeout=START_S)

    def stream(read: StreamRead) -> None:
        with pod.client(port, timeout=300) as client:
            read_stream(client, body, read)

    outcome, deletion = delete_under_load(pod, overlay=overlay, strategy=strategy,
                                          exits=exits, stream=stream)
    report(outcome)
    check_outcome(outcome, deletion, pod)
    return outcome, deletion, pod


def report(outcome: Outcome) -> None:
    """What the run recorded, in the test's output."""
    print(json.dumps({k: v for k, v in outcome.__dict__.items() if k != "drain"},
                     default=str, indent=1))
    if outcome.drain:
        print("drain:", json.dumps(outcome.drain.get("drain")))
        for process in outcome.drain.get("processes") or []:
            print("  reported:", json.dumps({k: process.get(k) for k in (
                "pid", "name", "fate", "exit_code", "signal", "tier", "detail")}))


@pytest.fixture
def vllm(images: Images, model: Path, podman: Podman) -> Machine:
    return vllm_machine(images, model)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overlay", ["vllm", "adopted-vllm"])
def test_a_vllm_overlay_pod_deleted_with_a_stream_in_flight(
        pods: PodFactory, process_exits: ProcessExits, tmp_path: Path, vllm: Machine,
        overlay: str, strategy: str) -> None:
    """1. The overlay's pod on podman with the real vLLM (CPU), Ready.
    2. A 1,500-token stream in flight; the pod deleted as the kubelet does.
    3. Every record agrees (``check_outcome``); as shipped, the goal holds
       (``check_goal``)."""
    body = {"model": "tiny", "prompt": prompt(6), "max_tokens": VLLM_TOKENS,
            "ignore_eos": True, "stream": True}
    outcome, deletion, pod = run_overlay(pods, process_exits, tmp_path, overlay, strategy,
                                         vllm, body, 8000)
    if strategy == "sidecar":
        check_goal(outcome, deletion, pod)


# SGLang: the real SGLang 0.5.23 on the CPU (ENGINES_DIR/sglang, with its out-of-tree CPU
# platform), the flags that run it there on the tiny model.
SGLANG_CPU = ("--served-model-name=tiny", "--device=cpu", "--load-format=dummy",
              "--attention-backend=torch_native", "--sampling-backend=pytorch",
              "--dtype=float32", "--mem-fraction-static=0.1", "--max-total-tokens=8192",
              "--skip-server-warmup")
SGLANG_TOKENS = 200


@pytest.fixture
def sglang(images: Images, model: Path, podman: Podman) -> Machine:
    venv = engine_venv("sglang")
    return Machine(
        image=images.engine("sglang", venv),
        args=lambda args: [*without_flags(args, "--model-path"), "--model-path=/model",
                           *SGLANG_CPU],
        env={"OMP_NUM_THREADS": "1"}, read_only=mounted(venv, model))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_sglang_overlay_pod_deleted_with_a_stream_in_flight(
        pods: PodFactory, process_exits: ProcessExits, tmp_path: Path, sglang: Machine,
        strategy: str) -> None:
    """1. The sglang overlay's pod with the real SGLang (CPU), Ready.
    2. A 200-token stream in flight; the pod deleted as the kubelet does.
    3. Every record agrees (``check_outcome``), the stream is whole, the engine container
       exits 0 and podman SIGKILLed nothing.
    4. As shipped: the sidecar exits 0 and the hook returns 0; the engine's main process
       exits 0 (the kernel's record) after the coordinator's SIGTERM, which it got first
       (its tier, ``sglang-root``); what the coordinator reports for each process is what
       the kernel and the runtime recorded. SGLang 0.5.23's own shutdown SIGKILLs its
       detokenizer (``kill_process_tree`` of its children), which the coordinator never
       does with time left (``killed_at`` unset): the outcome is ``signalled``, its cause
       names the engine's own SIGKILL, and no request was lost or cut.

    So the goal is not held for SGLang as it ships: the SIGKILLs are its own, with or
    without the coordinator (the baselines record them too); the drainable integration
    (docs/engines.md) is what ends them."""
    body = {"model": "tiny", "prompt": prompt(6), "max_tokens": SGLANG_TOKENS,
            "ignore_eos": True, "stream": True}
    outcome, deletion, _ = run_overlay(pods, process_exits, tmp_path, "sglang", strategy,
                                       sglang, body, 30000)
    assert outcome.stream == "whole", outcome.stream_error
    assert outcome.engine_exit == 0
    assert outcome.runtime_sigkill == []
    if strategy != "sidecar":
        return
    assert outcome.sidecar_exit == 0
    assert outcome.hook.startswith("exec, 0"), outcome.hook
    assert not outcome.events, outcome.events
    assert outcome.seconds < outcome.grace_period
    check_main_process_reported_as_recorded(outcome, deletion)
    check_every_process_reported_as_the_kernel_recorded(outcome)
    assert outcome.drain is not None
    main_pid = deletion.containers[ENGINE].pod_pid
    reported = {p["pid"]: p for p in outcome.drain["processes"]}
    assert reported[main_pid]["fate"] == "exited"
    assert reported[main_pid]["tier"] == "sglang-root"
    assert reported[main_pid]["signal"] == "SIGTERM"
    killed = [p for p in outcome.processes if p.end == "killed by SIGKILL"]
    assert any(p.name == "sglang::detokenizer" for p in killed), outcome.processes
    for process in killed:
        assert reported[process.pod_pid]["killed_at"] is None, reported[process.pod_pid]
    summary = outcome.drain["drain"]
    assert summary["outcome"] == "signalled", summary
    assert "a SIGKILL sent by the engine itself, not by the coordinator" in " ".join(
        summary["causes"]), summary["causes"]
    assert summary["lost_requests"] == 0
    assert summary["cut_requests"] == 0


def check_main_process_reported_as_recorded(outcome: Outcome, deletion: Deletion) -> None:
    """The coordinator's fate and exit code for the engine's main process are the runtime's
    record of the engine container (a signal as 128 + its number)."""
    assert outcome.drain is not None
    engine = deletion.containers[ENGINE]
    main = {p["pid"]: p for p in outcome.drain["processes"]}[engine.pod_pid]
    code = main["exit_code"]
    assert code is not None, main
    assert (code if code >= 0 else 128 - code) == engine.exit_code, (main, engine.exit_code)


# Dynamo: the overlay's worker command runs dynamo.mocker (Dynamo's worker runtime around a
# simulated engine; dynamo.vllm needs vLLM inside Dynamo's environment), with file discovery
# in place of etcd and NATS. Dynamo's frontend, elsewhere in a cluster, is run by the node in
# the pod's network namespace and reaches the worker at the pod IP.
DYNAMO_TOKENS = 400
DYNAMO_SPEEDUP = "0.25"
"""The mocker's pace (tests/engines/test_overlays_dynamo.py): about 40 tokens a second."""
FRONTEND_PORT = 8088


@pytest.fixture
def discovery(tmp_path: Path) -> Path:
    return shared_directory(tmp_path / "discovery")


@pytest.fixture
def dynamo(images: Images, model: Path, podman: Podman, discovery: Path) -> Machine:
    venv = engine_venv("dynamo")
    planes = {k: POD_IP for k in LOOPBACK_ENV}
    return Machine(
        image=images.engine("dynamo", venv),
        command=["python3", "-m", "dynamo.mocker"],
        args=lambda args: ["--model-path", "/model", "--model-name", "tiny", "--speedup-ratio",
                           DYNAMO_SPEEDUP, "--discovery-backend", "file"],
        env={**planes, "DYN_FILE_KV": "/discovery", "DYN_LOG": "info"},
        drop_env=("ETCD_ENDPOINTS", "NATS_SERVER"),
        read_only=mounted(venv, model), writable={str(discovery): "/discovery"})


def start_frontend(janitor: ProcessJanitor, pod: Pod, discovery: Path,
                   log: Path) -> subprocess.Popen[Any]:
    """Dynamo's frontend (``--migration-limit 3``, file discovery) in the pod's network
    namespace, serving on ``FRONTEND_PORT`` there; once it answers with the worker."""
    assert pod.infra_pid is not None
    python = engine_venv("dynamo") / "bin" / "python"
    env = {**LOOPBACK_ENV, "DYN_FILE_KV": str(discovery), "DYN_LOG": "info",
           "HOME": str(log.parent)}
    with log.open("ab") as out:
        frontend = janitor.spawn(
            ["nsenter", f"--net=/proc/{pod.infra_pid}/ns/net", str(python), "-m",
             "dynamo.frontend", "--discovery-backend", "file", "--migration-limit", "3",
             "--http-host", "0.0.0.0", "--http-port", str(FRONTEND_PORT)],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    janitor.service(frontend)

    def served() -> bool:
        assert frontend.poll() is None, log.read_text()[-3000:]
        try:
            with pod.client(FRONTEND_PORT, timeout=30) as client:
                return client.post("/v1/completions", json={
                    "model": "tiny", "prompt": prompt(3), "max_tokens": 2}).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(served, timeout=DYNAMO_START_S, interval=0.5, what="the frontend serving")
    return frontend


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_dynamo_worker_overlay_pod_deleted_with_a_stream_in_flight(
        pods: PodFactory, process_exits: ProcessExits, tmp_path: Path, dynamo: Machine,
        discovery: Path, janitor: ProcessJanitor, strategy: str) -> None:
    """1. The dynamo-worker overlay's pod with Dynamo's worker runtime, Ready; Dynamo's
       frontend serving through it.
    2. A 400-token stream through the frontend, in flight; the pod deleted as the kubelet
       does (the frontend stays).
    3. Every record agrees; as shipped, the goal holds."""
    manifest = rendered("dynamo-worker", tmp_path / "render")
    pod = pods(template(manifest, dynamo, strategy), objects_of(manifest),
               name=f"dynamo-worker-{strategy}", extra_ports=(FRONTEND_PORT,))
    pod.start(ready_timeout=START_S)
    start_frontend(janitor, pod, discovery, tmp_path / "frontend.log")
    body = {"model": "tiny", "prompt": prompt(6), "max_tokens": DYNAMO_TOKENS, "stream": True,
            "nvext": {"extra_fields": ["worker_id"]}}

    def stream(read: StreamRead) -> None:
        with pod.client(FRONTEND_PORT, timeout=300) as client:
            read_stream(client, body, read)

    outcome, deletion = delete_under_load(pod, overlay="dynamo-worker", strategy=strategy,
                                          exits=process_exits, stream=stream)
    report(outcome)
    check_outcome(outcome, deletion, pod)
    if strategy == "sidecar":
        check_goal(outcome, deletion, pod)


# TensorRT-LLM: no CPU build; the simulated engine in trtllm-serve's shape runs under the
# overlay's own command (tests/deploy/engine_shapes.py), its records on a hostPath. A stream
# is held after a few tokens until the root has its SIGTERM (then released), so it is in
# flight whatever the machine's speed.
SHIM = '''"""trtllm-serve as its overlay runs it: the simulated engine in its shape
(tests/deploy/engine_shapes.py)."""
from tests.deploy.engine_shapes import main

main()
'''


@pytest.fixture
def sim_records(tmp_path: Path) -> Path:
    return shared_directory(tmp_path / "records")


@pytest.fixture
def trtllm(images: Images, tmp_path: Path, sim_records: Path, podman: Podman) -> Machine:
    shims = tmp_path / "engine-shim"
    script = shims / "bin" / "trtllm-serve"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n" + SHIM)
    script.chmod(0o755)
    (shims / "site").mkdir()
    for directory in (shims, shims / "bin", shims / "site"):
        directory.chmod(0o755)
    knobs = SHAPES["trtllm"]
    config = {"sim_args": ["--record-dir", "/records", "--ready-file", "/records/ready.json",
                           *knobs.to_argv()], "hold_at": HOLD_AT}
    return Machine(image=images.simulated_engine(), args=lambda args: args,
                   env={SHAPED_ENGINE: json.dumps(config)},
                   read_only={str(REPO): "/src", str(shims): "/opt/engine-shim"},
                   writable={str(sim_records): "/records"})


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_trtllm_overlay_pod_deleted_with_a_stream_in_flight(
        pods: PodFactory, process_exits: ProcessExits, tmp_path: Path, trtllm: Machine,
        sim_records: Path, strategy: str) -> None:
    """1. The trtllm overlay's pod with the simulated engine in trtllm-serve's shape, Ready.
    2. A 40-token stream held after 5 tokens; the pod deleted as the kubelet does; the
       stream released once the root recorded its SIGTERM.
    3. Every record agrees, the engine's own records among them (every process exited 0
       after its cleanup, none SIGKILLed); as shipped, the goal holds."""
    manifest = rendered("trtllm", tmp_path / "render")
    pod = pods(template(manifest, trtllm, strategy), objects_of(manifest),
               name=f"trtllm-{strategy}")
    pod.start(ready_timeout=START_S)
    engine = pod.containers[ENGINE]
    assert engine.pod_pid is not None
    assert engine.host_pid is not None
    body = {"prompt": PROMPT, "max_tokens": STREAM_TOKENS, "stream": True}

    def stream(read: StreamRead) -> None:
        with pod.client(8000, timeout=300) as client:
            read_stream(client, body, read)

    during = release_when_signalled(sim_records, engine.pod_pid, engine.host_pid, RELEASE)
    outcome, deletion = delete_under_load(pod, overlay="trtllm", strategy=strategy,
                                          exits=process_exits, stream=stream, during=during)
    report(outcome)
    check_outcome(outcome, deletion, pod)
    records = {r["pid"]: r for r in read_records(sim_records)}
    assert {r["exit_code"] for r in records.values()} == {0}, records
    assert {r["cleanup"] for r in records.values()} == {"finished"}, records
    assert records[engine.pod_pid]["sigkilled_children"] == []
    assert outcome.stream_tokens == STREAM_TOKENS
    assert outcome.stream_text == "".join(expected_tokens(PROMPT, STREAM_TOKENS))
    if strategy == "sidecar":
        check_goal(outcome, deletion, pod)
