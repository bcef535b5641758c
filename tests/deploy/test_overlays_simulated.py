"""The SGLang and TRT-LLM overlays, drained for real against the simulated engine in their
shape (neither engine runs on this CPU-only machine; ``tests/engines/test_overlays.py`` does the
same with a real vLLM).

Each overlay is rendered with kustomize. The engine container's command runs the simulated
engine shaped like that engine (``tests/deploy/engine_shapes.py``: the engine's own command
line, a root that serves its open streams to their end on SIGTERM and then stops its
children). The coordinator runs with the overlay's ConfigMap as its environment, only
addresses and paths moved onto this machine (the engine's metrics too, when its profile reads
them), so it finds the engine by its profile's adopt pattern. A stream is put in flight and
the pod is deleted as the kubelet does it: the engine container's rendered preStop hook runs
(``GET /drain`` with the token), then the container's main process gets SIGTERM. Everything
is judged from ground truth: the engine's own end records, its root's wait status, ``/proc``.
"""


from __future__ import annotations

import signal
from pathlib import Path

import pytest

from coordinator.engines import PROFILES
from devstack.sim import expected_tokens
from tests.deploy.engine_shapes import RELEASE
from tests.deploy.held_stream import Stream, alive, watch
from tests.deploy.rendering import kubectl
from tests.deploy.simulated_pod import PROMPT, STREAM_TOKENS, Kubelet, start_pod
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.skipif(kubectl() is None, reason="kubectl is needed to render the overlays"),
    pytest.mark.timeout(120),
]


@pytest.mark.parametrize("overlay", ["sglang", "trtllm"])
def test_the_overlay_drains_its_engine_shape_whole(janitor: ProcessJanitor, tmp_path: Path,
                                                    overlay: str) -> None:
    """1. Start the pod: the engine in its shape under the overlay's command, the coordinator
       with the overlay's settings; it adopts the engine's root by the profile's pattern.
    2. Put a stream in flight; the engine holds it after a few tokens.
    3. Delete the pod as the kubelet does (rendered preStop hook, then SIGTERM to the root).
    4. Release the stream at the moment that shows who waits for it: SGLang's profile reads
       the engine's gauges, so when the coordinator is migrating and reads it in flight;
       TRT-LLM's reads none, so when the root has its SIGTERM (its uvicorn serves it on).
    5. The stream ends whole; the root was signalled first and exited 0, nothing runs, the
       coordinator SIGKILLed nothing; the summary's fates are those of the records. Every
       process finished its cleanup and exited 0, but for SGLang's detokenizer: SGLang's own
       shutdown SIGKILLs it (as the real 0.5.23 does), which the summary reports as the
       engine's doing, with the fix named, and so not graceful.
    """
    pod = start_pod(janitor, tmp_path, overlay)
    profile = PROFILES[overlay]
    assert pod.rendered.settings["SHUTDOWN_COORDINATOR_ENGINE"] == overlay
    root = pod.engine.pid
    stream = Stream(pod.engine.url, PROMPT, STREAM_TOKENS)
    kubelet = Kubelet(janitor, pod)

    if profile.inflight_metrics:
        watch(pod.coordinator, lambda s: s["phase"] == "migrating"
              and (s.get("engine_inflight") or {}).get("inflight") == 1,
              "the coordinator waiting on the engine's in-flight gauge")
    else:
        wait_for(lambda: (pod.engine.record_of(root) or {}).get("signal") == "SIGTERM",
                 timeout=60, what="the root's SIGTERM")
    pod.root.send_signal(RELEASE)
    stream.read_to_end()
    hook_code = kubelet.finished()
    root_code = pod.root.wait(timeout=60)
    summary = watch(pod.coordinator, lambda s: s["phase"] == "done", "the drain's end")

    # The stream: every token, in order, then [DONE].
    assert stream.done, "the stream was cut"
    assert stream.text == "".join(expected_tokens(PROMPT, STREAM_TOKENS))
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The engine's own records and wait status.
    records = pod.records()
    assert sorted(records) == sorted(pod.pids)
    assert root_code == 0, kubelet.output
    main = records[root]
    engine_killed = main.get("engine_sigkilled") or []
    assert [records[pid]["role"] for pid in engine_killed] == (
        ["detokenizer"] if overlay == "sglang" else []), main
    clean = {pid: r for pid, r in records.items() if pid not in engine_killed}
    assert {r["exit_code"] for r in clean.values()} == {0}, records
    assert {r["cleanup"] for r in clean.values()} == {"finished"}, records
    assert main["sigkilled_children"] == []
    assert main["signal"] == "SIGTERM"
    assert all(main["signalled_at"] <= r["signalled_at"] for r in clean.values())
    # SGLang's profile waited for the stream before the SIGTERM; TRT-LLM's root served it.
    assert main["streams_open_at_signal"] == (0 if profile.inflight_metrics else 1)
    assert alive(pod.pids) == []
    # The coordinator's summary says the same.
    report = {p["pid"]: p for p in summary["processes"]}
    assert sorted(report) == sorted(records)
    assert {p["fate"] for p in report.values()} == {"exited"}, report
    assert not [p for p in report.values() if p.get("killed_at")], report
    for pid, process in report.items():
        expected = -signal.SIGKILL if pid in engine_killed else records[pid]["exit_code"]
        assert process["exit_code"] in (None, expected), process
    if overlay == "sglang":
        # The hook reports the drain as not graceful (its exit code says so).
        assert summary["outcome"] == "signalled", summary.get("drain")
        (cause,) = summary["drain"]["causes"]
        assert "a SIGKILL sent by the engine itself, not by the coordinator" in cause
        assert "drainable integration" in cause
    else:
        assert hook_code == 0, kubelet.output
        assert summary["outcome"] == "graceful", summary.get("drain")
    assert report[root]["tier"] == f"{overlay}-root"


@pytest.mark.parametrize("overlay", ["sglang", "trtllm"])
def test_the_generic_order_makes_the_same_engine_kill_itself(
        janitor: ProcessJanitor, tmp_path: Path, overlay: str) -> None:
    """1. Start the same pod, the coordinator with the generic profile (children first,
       deepest first, the root last) and the overlay profile's adopt patterns.
    2. Delete the pod as the kubelet does.
    3. The first child's SIGTERM trips the engine's watchdog: the root SIGKILLs the tree and
       itself (its record names the child, its wait status is -9); the drain is not graceful.
    """
    pod = start_pod(janitor, tmp_path, overlay, profile="generic")
    root = pod.engine.pid
    Kubelet(janitor, pod).finished()
    root_code = pod.root.wait(timeout=60)
    summary = watch(pod.coordinator, lambda s: s["phase"] == "done", "the drain's end")

    records = pod.records()
    main = records[root]
    assert root_code == -signal.SIGKILL
    assert main["exit_code"] == -signal.SIGKILL
    assert main["detail"].startswith("watchdog: "), main
    first = min((r for r in records.values() if r["signalled_at"]),
                key=lambda r: r["signalled_at"])
    assert first["pid"] != root, "the generic order signals the children first"
    assert alive(pod.pids) == []
    # The summary: the main process died of a signal it was not sent gracefully.
    assert summary["outcome"] == "signalled", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert sorted(report) == sorted(records)
    assert report[root]["exit_code"] == -signal.SIGKILL, report[root]
