"""A Deployment's pods behind a real ``smg``, and how Kubernetes replaces one of them.

One ``Deployment`` per strategy of ``bench/rollout.py``. Its pods are real processes on
loopback (``devstack.local_stack``): with the coordinator, a pod is a coordinator told of
the router (``--router smg=URL``: it takes its engine out of smg at a drain's start, and
adds it at start once the engine answers ``/health``) and a simulated engine registered
with it, the two started together as the kubelet starts the manifest's pod (its native
sidecar has no startup probe: ``LocalStack.start_pod(together=True)``); without, a pod is
the engine alone (an engine registered with a coordinator would start a drain on its own
SIGTERM), stock (SIGKILL its tree on SIGTERM) or with its own graceful wait
(``--serve-open-streams-s``). Every engine logs the requests it takes
(``devstack.logged_engine``), so the counts can be held against the engines' own.

``delete`` plays the kubelet and the control plane for one pod (see ``Kube`` for the
times and why):

1. the pod is deleted: the router's service discovery drops it ``endpoint_delay_s`` later
   (``RouterProcess.remove_worker``, skipped when the router already stopped routing to it);
2. the preStop hook: none, ``sleep N``, or ``deploy/kubernetes/base/drain_hook.py
   --main-by-kubelet`` (the shipped exec hook: ``GET /drain?main=caller``), bounded by the
   grace period;
3. SIGTERM to the engine's main process (the container's own process) once the hook
   returned;
4. the engine gets what is left of the grace period, then SIGKILL for its whole group;
5. the coordinator (a native sidecar) gets SIGTERM once the engine's container ended,
   SIGKILL at the grace period's end; the pod is gone when both are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack import looks, routers
from devstack.local_stack import CoordinatorProcess, LocalStack, Prestarted, RoutedFleet
from devstack.logged_engine import logged_argv
from devstack.routers import RouterProcess
from devstack.sim.launcher import EngineHandle, engine_environment, start_engine
from devstack.sim.records import read_requests

ROOT = Path(__file__).resolve().parents[1]
DRAIN_HOOK = ROOT / "deploy" / "kubernetes" / "base" / "drain_hook.py"
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Strategy:
    """How a pod leaves: its preStop hook and what its engine does on SIGTERM."""

    name: str
    label: str
    coordinator: bool = False
    """The pod has a coordinator, and its preStop hook drains through it."""
    continuation: bool = False
    """Clients talk to the continuation proxy in front of smg, not to smg."""
    prestop_sleep: bool = False
    """``preStop: sleep N`` (``Kube.prestop_sleep_s``)."""
    engine_wait: bool = False
    """Without a coordinator: the engine serves open streams to their end on SIGTERM
    (``Kube.engine_wait_s``, ``--serve-open-streams-s``); else it is stock (SIGKILL its
    tree)."""
    prestarted: bool = False
    """The new pods' coordinators are started before the steady state is measured
    (``Deployment.prestart``), so the rollout starts only their engines."""
    control: str = ""
    """Not a way to deploy but a control, taking one thing in or out of another strategy's
    rollout: what it shows."""


@dataclass(frozen=True)
class Kube:
    """The cluster's times, scaled down with the streams (a 2-second stream here)."""

    endpoint_delay_s: float = 1.0
    """From the pod's deletion until the router stops picking it: the API server's watch
    event reaching the router's pod watcher (smg ``--service-discovery``) or the
    EndpointSlice update reaching kube-proxy. Usually well under a second, seconds on a busy
    control plane; it is why preStop sleeps exist. Strategies with the coordinator get it
    too, but their adapter took the pod out at the drain's start."""
    prestop_sleep_s: float = 2.0
    """``preStop: sleep N``: twice the endpoint delay, so the router has stopped sending
    before the engine hears SIGTERM (clusters use several times their propagation time)."""
    engine_wait_s: float = 3.0
    """The engine's own bound on serving open streams after SIGTERM (vLLM
    ``--shutdown-timeout``): what the grace period leaves after the sleep, less a second."""
    grace_period_s: float = 6.0
    """``terminationGracePeriodSeconds``: the kubelet SIGKILLs what is left after it. The
    coordinators are told the same (``COORDINATOR_ARGS``)."""


COORDINATOR_ARGS = ("--grace-period", "6", "--safety-margin", "1", "--tier-timeout", "2",
                    "--confirm-timeout", "1", "--prekill-timeout", "1")
"""A 5 s drain budget in a 6 s grace period: about 2 s of migration (a handoff nobody
acknowledges holds the phase to its end), 3 s for the ordered kill."""


@dataclass
class RolloutPod:
    name: str
    engine: EngineHandle
    coordinator: CoordinatorProcess | None = None

    @property
    def url(self) -> str:
        return self.engine.url

    def requests(self) -> list[dict[str, Any]]:
        """Every request the engine took, by its own log (``read_requests``)."""
        return read_requests(self.engine.record_dir)


@dataclass
class Deletion:
    """One old pod's end, in ``time.monotonic()`` seconds."""

    pod: str
    deleted_at: float
    endpoint_removed_at: float | None = None
    sigterm_at: float | None = None
    gone_at: float | None = None
    """Every process of the pod gone (the endpoint removal, ``endpoint_removed_at``, may come
    after)."""
    hook_exit: int | None = None
    engine_exit: int | None = None
    sigkilled: list[str] = field(default_factory=list)
    """Processes the kubelet had to SIGKILL at the grace period's end."""
    notes: list[str] = field(default_factory=list)


class Deployment:
    """One strategy's pods behind one smg; every process is ``stack``'s."""

    def __init__(self, stack: LocalStack, strategy: Strategy, kube: Kube, *,
                 token_interval_ms: float) -> None:
        self.stack = stack
        self.strategy = strategy
        self.kube = kube
        self.engine_knobs: dict[str, Any] = {"schedulers": 1,
                                             "token_interval_ms": token_interval_ms}
        self.pods: list[RolloutPod] = []
        self._router: RouterProcess | None = None
        self._fleet: RoutedFleet | None = None
        self._prestarted: dict[str, Prestarted] = {}

    @property
    def router(self) -> RouterProcess:
        assert self._router is not None, "start() first"
        return self._router

    # -- starting -----------------------------------------------------------------------

    def start(self, replicas: int) -> None:
        """``replicas`` pods behind a new smg, returned once smg routes to every one."""
        if self.strategy.coordinator:
            fleet = self.stack.start_routed_pods(
                "smg", replicas, adapter=True, coordinator_args=COORDINATOR_ARGS,
                name="old", **self.engine_knobs)
            self._fleet, self._router = fleet, fleet.router
            self.pods = [RolloutPod(p.name, p.engine, p.coordinator) for p in fleet.pods]
            return
        self.pods = [self._plain_pod(f"old{i}") for i in range(replicas)]
        self._router = routers.start_router("smg", self._spawn_router, self.stack.workdir,
                                            [p.url for p in self.pods])

    def prestart(self, names: Sequence[str]) -> None:
        """Start the coordinators of the new pods ``names`` now (``Strategy.prestarted``;
        with coordinators only), each up before the next starts; ``surge`` starts their
        engines beside them."""
        assert self._fleet is not None, "prestart is for pods with coordinators"
        for name in names:
            self._prestarted[name] = self.stack.prestart_routed_coordinator(self._fleet, name)

    def surge(self, name: str) -> RolloutPod:
        """A new pod, returned once it is Ready: its coordinator's ``/readyz`` answers 200
        (with one) and smg routes to it (the coordinator's join adds it; so does the call
        here, as service discovery would: whichever comes first)."""
        if self._fleet is not None:
            made = self.stack.add_routed_pod(self._fleet, name,
                                             prestarted=self._prestarted.pop(name, None))
            pod = RolloutPod(made.name, made.engine, made.coordinator)
            _wait_ready(f"{pod.coordinator.url}/readyz")  # type: ignore[union-attr]
        else:
            pod = self._plain_pod(name)
            self.router.add_worker(pod.url, timeout_s=READY_TIMEOUT_S)
        self.pods.append(pod)
        return pod

    def _plain_pod(self, name: str) -> RolloutPod:
        wait_s = self.kube.engine_wait_s if self.strategy.engine_wait else 0.0

        def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            # the same engine with its request log
            return self.stack.spawn(logged_argv(argv), f"{name}-engine.log", env=env)

        engine = start_engine(spawn, self.stack.workdir / f"{name}-records",
                              port=routers.free_port(), serve_open_streams_s=wait_s,
                              **self.engine_knobs)
        return RolloutPod(name, engine)

    def _spawn_router(self, argv: Sequence[str], log: Path,
                      env: dict[str, str]) -> subprocess.Popen[bytes]:
        return self.stack.spawn(argv, log.name, env={**engine_environment(), **env})

    # -- deleting -----------------------------------------------------------------------

    async def delete(self, pod: RolloutPod) -> Deletion:
        """The kubelet and the control plane deleting ``pod`` (the module's steps 1-5);
        returns when every process of the pod is gone and the router was told (step 1)."""
        gone = Deletion(pod.name, time.monotonic())
        deadline = gone.deleted_at + self.kube.grace_period_s
        # 1. Endpoint removal runs beside the hook, as it does in a cluster.
        endpoint = asyncio.create_task(self._endpoint_removal(pod, gone))
        # 2. The preStop hook.
        if pod.coordinator is not None:
            gone.hook_exit = await self._drain_hook(pod.coordinator.url, deadline, gone)
        elif self.strategy.prestop_sleep:
            await asyncio.sleep(max(0.0, min(self.kube.prestop_sleep_s,
                                              deadline - time.monotonic())))
        # 3. The kubelet's SIGTERM to the engine container's main process.
        gone.sigterm_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            if pod.engine.proc.poll() is None:
                os.kill(pod.engine.pid, signal.SIGTERM)
        # 4. What is left of the grace period, then SIGKILL.
        gone.engine_exit = await _wait_or_kill(pod.engine.proc, deadline, f"{pod.name} engine",
                                               gone)
        # 5. The sidecar, once the engine's container ended.
        if pod.coordinator is not None:
            with contextlib.suppress(ProcessLookupError):
                pod.coordinator.proc.send_signal(signal.SIGTERM)
            await _wait_or_kill(pod.coordinator.proc, max(deadline, time.monotonic() + 2.0),
                                f"{pod.name} coordinator", gone)
        # The pod is gone once its processes are; the router may drop it later (the endpoint
        # delay), which the rig waits for before it calls the deletion done.
        gone.gone_at = time.monotonic()
        await endpoint
        return gone

    async def _endpoint_removal(self, pod: RolloutPod, gone: Deletion) -> None:
        await asyncio.sleep(self.kube.endpoint_delay_s)

        def remove() -> None:
            if self.router.routes_to(pod.url):
                self.router.remove_worker(pod.url)
                gone.endpoint_removed_at = time.monotonic()
            else:
                gone.notes.append("the router had already stopped routing to it")

        try:
            await asyncio.to_thread(remove)
        except (routers.RouterError, httpx.HTTPError) as exc:
            gone.notes.append(f"endpoint removal failed: {exc!r}"[:300])

    async def _drain_hook(self, coordinator_url: str, deadline: float, gone: Deletion) -> int:
        """The engine container's exec hook, as the shipped manifests run it; killed (by its
        PID) when the grace period ends first."""
        hook = await asyncio.create_subprocess_exec(
            sys.executable, str(DRAIN_HOOK), "--main-by-kubelet", "--url", coordinator_url,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items()
                 if not k.startswith("SHUTDOWN_COORDINATOR_")})
        try:
            out, _ = await asyncio.wait_for(hook.communicate(),
                                            max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            hook.kill()
            await hook.wait()
            gone.notes.append("the preStop hook outlived the grace period")
            return -signal.SIGKILL
        except asyncio.CancelledError:  # the benchmark is failing: leave no hook behind
            if hook.returncode is None:
                hook.kill()
            raise
        if hook.returncode:
            gone.notes.append(f"hook exit {hook.returncode}: {out.decode(errors='replace')}"
                              [:300])
        return hook.returncode if hook.returncode is not None else -1


async def _wait_or_kill(proc: Any, deadline: float, what: str, gone: Deletion) -> int | None:
    """Wait for ``proc`` until ``deadline``, then SIGKILL its process group (the container's
    processes: each was started in a session of its own) and wait for it."""
    try:
        code: int | None = await asyncio.to_thread(proc.wait,
                                                   max(0.05, deadline - time.monotonic()))
        return code
    except subprocess.TimeoutExpired:
        gone.sigkilled.append(what)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        killed: int | None = await asyncio.to_thread(proc.wait)
        return killed


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if looks.get(url).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 in {READY_TIMEOUT_S:.0f}s")
        time.sleep(0.02)
