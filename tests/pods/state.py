"""What the pod runner knows of a pod: the kubelet's events, each container's spec and what
happened to it (started, ready, its hook, how it was stopped, the runtime's record of its
end), and each deletion."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.pods.handlers import HandlerResult


@dataclass
class Event:
    """A Kubernetes Event the kubelet would record for the pod."""

    at: float
    type: str
    reason: str
    container: str
    message: str


@dataclass
class Container:
    """One of the pod's containers: its spec, and what happened to it."""

    spec: dict[str, Any]
    init: bool
    index: int
    runtime_name: str
    started: bool = False
    ready: bool = False
    ready_changes: list[tuple[float, bool]] = field(default_factory=list)
    host_pid: int | None = None
    """The container's main process on the host, while it runs."""
    start_ticks: int | None = None
    """Its start time (``/proc/<pid>/stat``): with the PID, its identity."""
    pod_pid: int | None = None
    """The same process in the pod's PID namespace."""
    hook: HandlerResult | None = None
    waited_for_turn_s: float = 0.0
    grace_given: int | None = None
    """Seconds ``podman stop`` was given."""
    stop_sent_at: float | None = None
    stopped_at: float | None = None
    runtime_sigkill: bool = False
    """podman said it had to SIGKILL the main process (the stop signal did not end it)."""
    state: dict[str, Any] = field(default_factory=dict)
    """``State`` of ``podman inspect`` once it exited."""
    log: str = ""

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    @property
    def exit_code(self) -> int | None:
        code = self.state.get("ExitCode")
        return None if code is None else int(code)


@dataclass
class Deletion:
    """One deletion of the pod, as the kubelet ran it."""

    grace_period: int
    started_at: float
    gone_at: float | None = None
    containers: dict[str, Container] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        assert self.gone_at is not None
        return self.gone_at - self.started_at
