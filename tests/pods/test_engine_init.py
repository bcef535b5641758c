"""The ``vllm-init`` overlay as a pod on podman with the real vLLM: ``shutdown-coordinator
run`` the engine container's PID 1 (no sidecar, no shared PID namespace, no hook), a stream
in flight, the pod deleted as the kubelet deletes it (no preStop hook, so at once the
runtime's stop: SIGTERM to PID 1, SIGKILL when the grace period runs out).

The goal, from the records of the things themselves: the engine container exits 0 (the
runtime's record), no process of the pod dies of SIGKILL or of its main process's signal
(the kernel's record), the stream is whole, the pod is gone inside the grace period; and
what the coordinator says of it all in its last log lines (its summary, each process it
ended, its drain's end) is what the runtime and the kernel recorded.

Not in CI's default container selection (its time is spent): ``CONTAINER_TESTS=all bash
scripts/test.sh``, or ``ENGINES_DIR=... pytest -m container tests/pods/test_engine_init.py``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from coordinator.kill.report import Fate
from tests.engines.tiny_model import prompt
from tests.pods.conftest import PodFactory
from tests.pods.exits import ProcessExits
from tests.pods.images import Images
from tests.pods.overlays import ENGINE, INIT, Machine
from tests.pods.podman import Podman
from tests.pods.test_overlays import (
    VLLM_TOKENS,
    check_every_process_reported_as_the_kernel_recorded,
    engine_venv,
    run_overlay,
    vllm_machine,
)

pytestmark = [pytest.mark.container, pytest.mark.timeout(1500)]

COORDINATOR_PID = 1
"""The coordinator is the engine container's first process: PID 1 of its own namespace."""


@pytest.fixture
def vllm_init(images: Images, model: Path, podman: Podman) -> Machine:
    """vLLM as the vllm overlays run it here, in the image the overlay names: the engine's
    with the coordinator added by deploy/container/Dockerfile.engine-init."""
    return dataclasses.replace(vllm_machine(images, model),
                               image=images.engine_init("vllm", engine_venv("vllm")))


def test_the_vllm_init_overlay_pod_deleted_with_a_stream_in_flight(
        pods: PodFactory, process_exits: ProcessExits, tmp_path: Path,
        vllm_init: Machine) -> None:
    """1. The overlay's pod with the real vLLM (CPU) behind ``shutdown-coordinator run``,
       Ready (the coordinator's ``/readyz`` on the pod IP).
    2. A 1,500-token stream in flight; the pod deleted as the kubelet does.
    3. Every record agrees (``check_outcome``): the runtime's exit code of the engine
       container is the kernel's end of its PID 1, the coordinator.
    4. The goal: the container exits 0, nothing is SIGKILLed (by the runtime or anyone),
       the engine's main process and the coordinator exit 0, the stream is whole, the pod
       is gone inside the grace period.
    5. The coordinator's last log line is its summary, and it is the truth: its exit code
       the runtime's, its main process the one the kernel saw exit 0, a graceful drain,
       no child left; each process it ended reported as the kernel recorded it, its fate
       counts those of its own lines."""
    body = {"model": "tiny", "prompt": prompt(6), "max_tokens": VLLM_TOKENS,
            "ignore_eos": True, "stream": True}
    outcome, deletion, pod = run_overlay(pods, process_exits, tmp_path, "vllm-init", INIT,
                                         vllm_init, body, 8000)
    engine = deletion.containers[ENGINE]
    log = engine.log[-6000:]
    # The pod's shape: one container, its own PID namespace, the coordinator its PID 1.
    assert list(pod.containers) == [ENGINE]
    assert not pod.spec.get("shareProcessNamespace")
    assert engine.pod_pid == COORDINATOR_PID
    # 4. The goal.
    assert outcome.engine_exit == 0, log
    assert outcome.runtime_sigkill == [], log
    assert outcome.hook == "none"
    assert not outcome.events, outcome.events
    assert outcome.stream == "whole", outcome.stream_error
    assert outcome.seconds < outcome.grace_period
    kernel = {p.pod_pid: p.end for p in outcome.processes}
    assert kernel[COORDINATOR_PID] == "exit 0", outcome.processes
    # 5. The coordinator's summary against the runtime and the kernel.
    drain = outcome.drain
    assert drain is not None, f"the log's last line is not the summary:\n{log}"
    summary = drain["init"]
    main_pid = int(summary["main_pid"])
    assert main_pid != COORDINATOR_PID
    assert kernel[main_pid] == "exit 0", outcome.processes
    # Nothing died of a signal but a child of the engine's own that its parent stopped
    # with SIGTERM (as the sidecar overlays accept, DESIGN.md "Outcome").
    assert [p for p in outcome.processes if p.end not in ("exit 0", "killed by SIGTERM")
            or (p.end != "exit 0" and p.pod_pid in (COORDINATOR_PID, main_pid))] == [], \
        outcome.processes
    assert int(summary["exit_code"]) == engine.exit_code == 0, summary
    assert summary["main"] == "exited 0", summary
    assert summary["command"].startswith("python3 -m vllm.entrypoints.openai.api_server")
    assert summary["drain"] == "graceful", (summary, drain["drain"])
    assert int(summary["stop_signals"]) == 1, summary
    assert int(summary["children_left"]) == 0, summary
    assert drain["drain"]["outcome"] == "graceful", drain["drain"]
    assert int(drain["drain"]["lost_requests"]) == 0, drain["drain"]
    reported = {p["pid"]: p for p in drain["processes"]}
    assert reported[main_pid]["fate"] == Fate.EXITED.value, reported[main_pid]
    assert reported[main_pid]["exit_code"] == 0, reported[main_pid]
    check_every_process_reported_as_the_kernel_recorded(outcome)
    counted = {fate.value: int(summary.get(fate.value) or 0) for fate in Fate}
    assert {k: n for k, n in counted.items() if n} == Counter(
        p["fate"] for p in drain["processes"]), (summary, drain["processes"])
