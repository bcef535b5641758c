"""The kubelet's probe workers for one container (``pkg/kubelet/prober/worker.go``).

The startup probe runs until it passes (the container counts as started then, or at once
without one); then the readiness and liveness probes run every ``periodSeconds``, each
result counted against ``successThreshold``/``failureThreshold``. A container without a
readiness probe is ready once started. Each failure is an ``Unhealthy`` Warning event; a
liveness probe reaching its failure threshold is the kubelet's ``Killing`` event ("failed
liveness probe, will be restarted"), though the container is not restarted (not reproduced).
Probing ends when the container's main process does, or when the pod is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tests.pods.handlers import Node
from tests.pods.processes import running
from tests.pods.state import Container

PROBE_DEFAULTS = {"periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                  "failureThreshold": 3, "initialDelaySeconds": 0}
KINDS = ("startupProbe", "readinessProbe", "livenessProbe")

Record = Callable[[str, str, str, str], None]
"""``record(type, reason, container, message)``: an event of the pod."""


class Prober:
    """Probes one container until ``stop`` is set or its main process ends."""

    def __init__(self, container: Container, node: Node, record: Record,
                 stop: threading.Event) -> None:
        self.container = container
        self.node = node
        self.record = record
        self.stop = stop
        spec = container.spec
        self.period = {k: float({**PROBE_DEFAULTS, **spec[k]}["periodSeconds"])
                       for k in KINDS if k in spec}

    def run(self) -> None:
        if not self._started():
            return
        self.container.started = True
        spec = self.container.spec
        if "readinessProbe" not in spec:
            self._set_ready(True)
        states: dict[str, dict[str, int]] = {k: {} for k in self.period if k != "startupProbe"}
        due = {k: time.monotonic() + float(spec[k].get("initialDelaySeconds", 0))
               for k in states}
        due["running"] = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if not self._alive():
                self._set_ready(False)
                return
            for kind, state in states.items():
                if now >= due[kind]:
                    decided = self._probe(kind, state)
                    if kind == "readinessProbe" and decided is not None:
                        self._set_ready(decided)
                    due[kind] = time.monotonic() + self.period[kind]
            due["running"] = time.monotonic() + 1.0
            self.stop.wait(max(0.05, min(due.values()) - time.monotonic()))

    def _started(self) -> bool:
        """Run the startup probe until it passes (True), or until the container or the pod
        ends (False); True at once without one."""
        if "startupProbe" not in self.container.spec:
            return True
        if self.stop.wait(float(self.container.spec["startupProbe"].get(
                "initialDelaySeconds", 0))):
            return False
        state: dict[str, int] = {}
        while not self.stop.is_set() and self._alive():
            if self._probe("startupProbe", state):
                return True
            self.stop.wait(self.period["startupProbe"])
        return False

    def _probe(self, kind: str, state: dict[str, int]) -> bool | None:
        """One run of a probe with its thresholds: True/False once they decide, else None."""
        container = self.container
        probe = {**PROBE_DEFAULTS, **container.spec[kind]}
        result = self.node.run(probe, container.spec, container.runtime_name,
                               probe_timeout=float(probe["timeoutSeconds"]))
        if result.failed:
            state["ok"], state["failed"] = 0, state.get("failed", 0) + 1
            self.record("Warning", "Unhealthy", container.name,
                        f"{kind.removesuffix('Probe').capitalize()} probe failed: "
                        f"{result.error}")
            if state["failed"] < int(probe["failureThreshold"]):
                return None
            if kind == "livenessProbe":
                self.record("Normal", "Killing", container.name,
                            f"Container {container.name} failed liveness probe, will be "
                            "restarted")
            return False
        state["failed"], state["ok"] = 0, state.get("ok", 0) + 1
        return True if state["ok"] >= int(probe["successThreshold"]) else None

    def _alive(self) -> bool:
        """Its main process still runs (from ``/proc``: a podman call per probe would cost
        this 2-core machine more than the probes themselves)."""
        return running(self.container.host_pid, self.container.start_ticks)

    def _set_ready(self, ready: bool) -> None:
        container = self.container
        if container.ready != ready or not container.ready_changes:
            container.ready = ready
            container.ready_changes.append((time.time(), ready))
