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

import json
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import pytest

from coordinator.engines import PROFILES
from devstack.sim import EngineHandle, EngineKnobs, expected_tokens, start_engine
from tests.deploy.engine_shapes import RELEASE, install, moved, spawner
from tests.deploy.held_stream import Stream, alive, watch
from tests.deploy.rendering import SHIPPED, Rendered, kubectl, render, stage
from tests.service.servers import ROOT, Running
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.skipif(kubectl() is None, reason="kubectl is needed to render the overlays"),
    pytest.mark.timeout(120),
]

SHAPES = {
    # Two TP schedulers and a detokenizer, each with PDEATHSIG; the main process's watchdog
    # SIGKILLs the tree when one of them exits while it is armed (SubprocessWatchdog).
    "sglang": EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2),
    # Two MPI workers (the sim's schedulers; the sim always adds a detokenizer child, here in
    # the place of a postprocess worker). The watchdog stands for an executor that fails when
    # a worker dies under it (proxy.py: a worker's failure goes to its error queue).
    "trtllm": EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2),
}
HOLD_AT = 5
"""Tokens a stream streams before it waits for the test's release."""
STREAM_TOKENS = 40
PROMPT = "Drain me whole:"
TOKEN = "overlay-token"


@dataclass
class Pod:
    """A rendered overlay, running here: its engine and its coordinator."""

    rendered: Rendered
    engine: EngineHandle
    coordinator: Running
    tmp: Path

    @property
    def root(self) -> subprocess.Popen[Any]:
        """The engine's root: the container's main process, started by this test."""
        return cast("subprocess.Popen[Any]", self.engine.proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.engine.processes]

    def records(self) -> dict[int, dict[str, Any]]:
        return {r["pid"]: r for r in self.engine.records()}


def rendered(name: str, scratch: Path) -> Rendered:
    variant = next(v for v in SHIPPED if v.name == name)
    return Rendered(variant, render(stage(scratch), variant))


def start_pod(janitor: ProcessJanitor, tmp: Path, overlay: str,
              profile: str | None = None) -> Pod:
    """1. Render the overlay; its engine command runs the simulated engine in the engine's
       shape, its ``--host``/``--port`` moved onto loopback.
    2. Start the coordinator with the rendered ConfigMap (addresses and paths moved; the
       profile's metrics URL pointed at the engine; confined to the engine's tree, as the
       pod's PID namespace confines it). ``profile`` replaces the overlay's engine profile,
       keeping the adoption patterns the overlay's profile gives.
    3. Wait until the coordinator lists the engine's whole tree.
    """
    pod = rendered(overlay, tmp / "render")
    container = pod.engine
    installed = install(container["command"], tmp / "engine-bin")
    with (tmp / "engine.log").open("ab") as log:
        spawn = spawner(janitor.spawn, installed, moved(container.get("args") or []),
                        HOLD_AT, stdout=log, stderr=subprocess.STDOUT)
        engine = start_engine(spawn, tmp / "records", SHAPES[overlay])

    settings = dict(pod.settings)
    named = PROFILES[settings["SHUTDOWN_COORDINATOR_ENGINE"]]
    metrics = settings.get("SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL") or named.metrics_url
    (tmp / "token").write_text(TOKEN + "\n")
    settings.update({
        "SHUTDOWN_COORDINATOR_HOST": "127.0.0.1",
        "SHUTDOWN_COORDINATOR_PORT": "0",
        "SHUTDOWN_COORDINATOR_PORT_FILE": str(tmp / "port.json"),
        "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp / "token"),
        "SHUTDOWN_COORDINATOR_STATE_FILE": str(tmp / "state.json"),
        "SHUTDOWN_COORDINATOR_DOORBELL": str(tmp / "doorbell"),
        "SHUTDOWN_COORDINATOR_CONFINE_TO_PID": str(engine.pid),
    })
    if metrics:
        parts = urlsplit(metrics)
        settings["SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL"] = urlunsplit(
            parts._replace(netloc=f"127.0.0.1:{engine.port}"))
    if profile is not None:
        settings["SHUTDOWN_COORDINATOR_ENGINE"] = profile
        settings["SHUTDOWN_COORDINATOR_ADOPT_PATTERNS"] = json.dumps(named.adopt_patterns)
        settings.pop("SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL", None)
    with (tmp / "coordinator.log").open("ab") as handle:
        proc = janitor.spawn([sys.executable, "-m", "coordinator", "serve"], cwd=ROOT,
                             env=settings, stdout=handle, stderr=subprocess.STDOUT,
                             service=True)
    url = wait_for(lambda: (tmp / "port.json").exists()
                   and json.loads((tmp / "port.json").read_text())["url"],
                   what="the coordinator listening")
    coordinator = Running(proc=proc, url=url, token=TOKEN, log=tmp / "coordinator.log")
    running = Pod(pod, engine, coordinator, tmp)
    watch(coordinator, lambda s: set(running.pids) <= {p["pid"] for p in s["processes"]},
          "the coordinator lists the engine's whole tree")
    return running


class Kubelet:
    """The kubelet deleting the pod: the engine container's rendered preStop hook (the exec
    command, its script from the rendered ConfigMap, URL and token file moved), then, once
    the hook returned, SIGTERM to the container's main process (the engine's root)."""

    def __init__(self, janitor: ProcessJanitor, pod: Pod) -> None:
        self.pod = pod
        container = pod.rendered.engine
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        script = command[1]
        volume = pod.rendered.volume_at(container, script)
        assert volume is not None
        source = pod.rendered.named("ConfigMap", volume["configMap"]["name"])
        hook = pod.tmp / "hook" / Path(script).name
        hook.parent.mkdir()
        hook.write_text(source["data"][hook.name])
        env = pod.rendered.env(container)
        assert env["SHUTDOWN_COORDINATOR_URL"]["value"].startswith("http://127.0.0.1:")
        assert "SHUTDOWN_COORDINATOR_TOKEN_FILE" in env
        self.proc = janitor.spawn(
            [sys.executable, str(hook), *command[2:]],
            env={"SHUTDOWN_COORDINATOR_URL": pod.coordinator.url,
                 "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(pod.tmp / "token")},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = ""
        self._thread = threading.Thread(target=self._after_the_hook, daemon=True)
        self._thread.start()

    def _after_the_hook(self) -> None:
        try:
            out, _ = self.proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            return  # the janitor ends it; finished() fails the test
        self.output = out.decode(errors="replace")
        root = self.pod.root
        if root.poll() is None:
            root.send_signal(signal.SIGTERM)

    def finished(self) -> int:
        """The hook's exit code, once the kubelet's SIGTERM (if any) was sent."""
        self._thread.join(timeout=120)
        code = self.proc.returncode
        assert not self._thread.is_alive(), "the preStop hook hangs"
        assert code is not None, "the preStop hook hangs"
        return int(code)


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
    5. The stream ends whole; every process finished its cleanup and exited 0, none was
       SIGKILLed, the root was signalled first and exited 0, nothing runs; the summary's
       fates are those of the records.
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
    assert {r["exit_code"] for r in records.values()} == {0}, records
    assert {r["cleanup"] for r in records.values()} == {"finished"}, records
    main = records[root]
    assert main["sigkilled_children"] == []
    assert main["signal"] == "SIGTERM"
    assert all(main["signalled_at"] <= r["signalled_at"] for r in records.values())
    # SGLang's profile waited for the stream before the SIGTERM; TRT-LLM's root served it.
    assert main["streams_open_at_signal"] == (0 if profile.inflight_metrics else 1)
    assert alive(pod.pids) == []
    # The coordinator's summary says the same.
    assert hook_code == 0, kubelet.output
    assert summary["outcome"] == "graceful", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert sorted(report) == sorted(records)
    assert {p["fate"] for p in report.values()} == {"exited"}, report
    assert not [p for p in report.values() if p.get("killed_at")], report
    for pid, process in report.items():
        assert process["exit_code"] in (None, records[pid]["exit_code"]), process
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
