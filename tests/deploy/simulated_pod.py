"""A rendered variant of the manifests running here: the engine in its engine's shape under
the rendered command, its coordinator with the rendered settings, and the kubelet deleting
the pod (the rendered preStop hook, then SIGTERM to the container's main process).

The engine container's command runs the simulated engine shaped like that engine
(``tests/deploy/engine_shapes.py``); the coordinator runs with the rendered ConfigMap and the
coordinator container's own environment, only addresses and paths moved onto this machine.
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

from coordinator.engines import PROFILES
from coordinator.router_settings import parse_router
from devstack.sim import EngineHandle, EngineKnobs, start_engine
from tests.deploy.engine_shapes import install, moved, spawner
from tests.deploy.held_stream import watch
from tests.deploy.rendering import VARIANTS, Rendered, render, stage
from tests.service.servers import ROOT, Running
from tests.support.processes import ProcessJanitor, wait_for

SHAPES = {
    # Two TP schedulers and a detokenizer, each with PDEATHSIG; the main process's watchdog
    # SIGKILLs the tree when one of them exits while it is armed (SubprocessWatchdog). On its
    # own shutdown the schedulers leave and the detokenizer gets SIGKILL, as the real
    # SGLang 0.5.23 does (ShutdownReq, then kill_process_tree).
    "sglang": EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2, sigkill_leftovers=True),
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
    """A rendered variant, running here: its engine and its coordinator."""

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
    variant = next(v for v in VARIANTS if v.name == name)
    return Rendered(variant, render(stage(scratch), variant))


def start_pod(janitor: ProcessJanitor, tmp: Path, overlay: str,
              profile: str | None = None, routers: dict[str, str] | None = None) -> Pod:
    """1. Render the overlay; its engine command runs the simulated engine in the engine's
       shape, its ``--host``/``--port`` moved onto loopback.
    2. Start the coordinator with the rendered ConfigMap (addresses and paths moved; the
       profile's metrics URL pointed at the engine; confined to the engine's tree, as the
       pod's PID namespace confines it). ``profile`` replaces the overlay's engine profile,
       keeping the adoption patterns the overlay's profile gives. The coordinator
       container's ``http://$(POD_IP):PORT`` for the routers becomes the engine's loopback
       address, and each rendered router's address the one ``routers`` gives for its kind.
    3. Wait until the coordinator lists the engine's whole tree.
    """
    pod = rendered(overlay, tmp / "render")
    container = pod.engine
    installed = install(container["command"], tmp / "engine-bin")
    with (tmp / "engine.log").open("ab") as log:
        spawn = spawner(janitor.spawn, installed, moved(container.get("args") or []),
                        HOLD_AT, stdout=log, stderr=subprocess.STDOUT)
        engine = start_engine(spawn, tmp / "records", SHAPES[pod.variant.engine])

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
    if "SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL" in pod.env(pod.coordinator):
        settings["SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL"] = f"http://127.0.0.1:{engine.port}"
    if routers is not None:
        rendered_routers = settings["SHUTDOWN_COORDINATOR_ROUTERS"].split(",")
        settings["SHUTDOWN_COORDINATOR_ROUTERS"] = ",".join(
            f"{spec.kind}={routers[spec.kind]}" for spec in map(parse_router, rendered_routers))
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


