"""Run pods on one machine: coordinators, simulated engines, and a router in front.

The demo, the tests and the benchmarks need the same pieces a cluster has — one coordinator
per pod next to its engine, a router in front — as real processes on loopback ports.
``LocalStack`` starts them, each in its own session, and ``close()`` ends every one of them
with the project's own kill engine (SIGTERM in order, SIGKILL for stragglers), so nothing
outlives the stack.

Two kinds of router:

- the reference router (``start_router``), which watches each pod's coordinator itself;
- a real one, ``smg`` or ``vllm-router`` (``start_routed_pods``), with each pod's
  coordinator told to take its engine out of the router when it drains (``--router
  KIND=URL --router-worker-url ENGINE_URL``), or not (``adapter=False``: the router's own
  health checks only, or whatever the caller does through ``RoutedFleet.router``)::

      stack = LocalStack(workdir)
      fleet = stack.start_routed_pods("smg", 3)           # 3 pods behind smg, adapters on
      fleet.router.url                                    # where clients send requests
      new = stack.add_routed_pod(fleet, "pod3")           # a surge pod, routed to once ready
      proxy = stack.start_continuation_proxy(fleet.router.url,
                                             [p.coordinator.url for p in fleet.pods])
      httpx.get(fleet.pods[0].coordinator.url + "/drain") # the preStop hook's call
      await stack.close()
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from coordinator.kill import KillPolicy, Target, terminate
from devstack import looks, routers
from devstack.logged_engine import logged_argv
from devstack.routers import RouterProcess
from devstack.sim.launcher import EngineHandle, engine_environment, start_engine
from devstack.sim.records import read_requests

START_TIMEOUT_S = 60.0
"""Bounds a failed start only; a healthy coordinator answers in well under a second."""
ROUTED_ENGINE = {"schedulers": 1, "graceful_main": True}
"""Engine knobs of a pod behind a real router unless told: one scheduler (a 2-core machine
runs a router and several pods), and a main process that exits 0 on the coordinator's
SIGTERM, as an engine with the upstream fix does."""

Popen = Callable[..., "subprocess.Popen[bytes]"]
"""Starts a process: called as ``popen(argv, env=..., stdout=..., stderr=...)``."""


def _popen_own_session(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True,
                            **kwargs)


class StackError(RuntimeError):
    """A process of the stack did not start."""


@dataclass
class CoordinatorProcess:
    """A coordinator this stack started."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path


@dataclass
class Pod:
    """A coordinator and the simulated engine registered with it."""

    name: str
    coordinator: CoordinatorProcess
    engine: EngineHandle

    def roles(self) -> dict[int, str]:
        """Engine process roles by pid, as the engine's ready file lists them."""
        return {p.pid: p.role for p in self.engine.processes}

    def requests(self) -> list[dict[str, Any]]:
        """Every request the engine took, by its own log, in arrival order (a pod started
        with ``request_log``; ``devstack.sim.records.read_requests`` has the fields)."""
        return read_requests(self.engine.record_dir)


@dataclass
class RoutedFleet:
    """Pods behind one real router (``LocalStack.start_routed_pods``)."""

    router: RouterProcess
    pods: list[Pod]
    adapter: bool
    """Each pod's coordinator takes its engine out of the router when it drains
    (``--router``); False: nothing tells the router, which sees only its health checks."""
    coordinator_args: tuple[str, ...] = ()
    engine_knobs: dict[str, Any] = field(default_factory=dict)
    """What ``add_routed_pod`` starts a new pod with, unless told otherwise."""

    @property
    def kind(self) -> str:
        return self.router.kind


@dataclass(frozen=True)
class Prestarted:
    """A routed pod's coordinator, started before its engine
    (``LocalStack.prestart_routed_coordinator``)."""

    coordinator: CoordinatorProcess
    engine_url: str
    """Where the pod's engine will listen: the coordinator was told so."""


class StackClosed(RuntimeError):
    """A process was to start after the stack began to close."""


class LocalStack:
    """Processes of a local pod fleet; every one of them ends in ``close()``."""

    def __init__(self, workdir: Path, popen: Popen | None = None) -> None:
        """``popen`` starts every process (default: ``subprocess.Popen`` in a session of its
        own); tests pass their janitor's ``spawn``, so its SIGKILL fallback covers them."""
        self.workdir = workdir
        self._popen = popen or _popen_own_session
        self._procs: list[subprocess.Popen[bytes]] = []
        self._coordinators: set[int] = set()
        self._closing = False
        self._starting = threading.Lock()
        """Held while a process starts (pods start in worker threads) and while ``close``
        begins: whatever started is then in ``_procs``, and nothing starts after it."""
        self.router: subprocess.Popen[bytes] | None = None
        """The router ``start_router`` started last."""

    # -- starting -------------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], log_name: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own, its output appended to ``log_name``; it
        ends in ``close()`` like every other process of the stack."""
        with self._starting:
            if self._closing:  # a start in a worker thread that outlived an interruption
                raise StackClosed(f"not starting {log_name}: the stack is closing")
            log: IO[bytes] = (self.workdir / log_name).open("ab")
            try:
                proc = self._popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                   env=kwargs.pop("env", engine_environment()), **kwargs)
            finally:
                log.close()
            self._procs.append(proc)
        return proc

    def start_coordinator(self, name: str, *args: str, port: int = 0) -> CoordinatorProcess:
        """``shutdown-coordinator serve`` on a loopback port (0: a free one); returns once it
        answers. A restart on the same ``port`` keeps the URL routers and engines know."""
        return self._coordinator_up(name, self._spawn_coordinator(name, *args, port=port))

    def _spawn_coordinator(self, name: str, *args: str, port: int = 0
                           ) -> subprocess.Popen[bytes]:
        port_file = self.workdir / f"{name}.port.json"
        port_file.unlink(missing_ok=True)
        proc = self.spawn(
            [sys.executable, "-m", "coordinator", "serve", "--port", str(port),
             "--port-file", str(port_file), "--log-level", "warning", *args],
            f"{name}.log",
        )
        self._coordinators.add(proc.pid)
        return proc

    def _coordinator_up(self, name: str, proc: subprocess.Popen[bytes]) -> CoordinatorProcess:
        url = _wait_for_json_url(proc, self.workdir / f"{name}.port.json",
                                 f"coordinator {name}")
        _wait_healthy(proc, url + "/healthz", f"coordinator {name}")
        return CoordinatorProcess(proc, url, self.workdir / f"{name}.log")

    def start_pod(self, name: str, coordinator_args: Sequence[str] = (), *,
                  request_log: bool = False, together: bool = False,
                  coordinator: CoordinatorProcess | None = None, **engine_knobs: Any) -> Pod:
        """A coordinator, then an engine that registers with it (waits for the registration).

        ``request_log``: the engine logs every request it takes (``Pod.requests()``): the
        same engine and flags, started through this module's ``engine`` entry point.
        ``together``: the engine starts right after the coordinator's process, not once the
        coordinator answers, as the kubelet starts the manifests' pods (the native sidecar
        has no startup probe: deploy/kubernetes/base/engine-deployment.yaml); the engine's
        worker client registers once the coordinator listens.
        ``coordinator``: one already running, started by this stack (``coordinator_args``
        and ``together`` then unused): only the engine starts."""
        proc = None
        if coordinator is not None:
            coordinator_url = coordinator.url
        elif together:
            port = routers.free_port()
            proc = self._spawn_coordinator(f"{name}-coordinator", *coordinator_args,
                                           port=port)
            coordinator_url = f"http://127.0.0.1:{port}"
        else:
            coordinator = self.start_coordinator(f"{name}-coordinator", *coordinator_args)
            coordinator_url = coordinator.url

        def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            if request_log:
                argv = logged_argv(argv)
            return self.spawn(argv, f"{name}-engine.log", env=env)

        engine = start_engine(spawn, self.workdir / f"{name}-records",
                              coordinator=coordinator_url, **engine_knobs)
        if proc is not None:
            coordinator = self._coordinator_up(f"{name}-coordinator", proc)
            if coordinator.url != coordinator_url:
                raise StackError(f"{name}'s coordinator listens on {coordinator.url}, "
                                 f"not {coordinator_url}")
        assert coordinator is not None
        pod = Pod(name, coordinator, engine)
        _wait_until(lambda: _registered(pod), f"{name}'s engine to register")
        return pod

    def start_router(self, pods: Sequence[Pod], *args: str, port: int = 0) -> str:
        """The reference router over ``pods`` on a loopback port (0: a free one); returns
        its URL."""
        ready = self.workdir / "router.json"
        ready.unlink(missing_ok=True)
        workers: list[str] = []
        for pod in pods:
            workers += ["--worker", f"{pod.engine.url}={pod.coordinator.url}"]
        proc = self.spawn(
            [sys.executable, "-m", "devstack.reference_router", "--port", str(port),
             "--ready-file", str(ready), *workers, *args],
            "router.log",
        )
        self.router = proc
        return _wait_for_json_url(proc, ready, "router")

    def start_routed_pods(self, kind: str, count: int, *, adapter: bool = True,
                          coordinator_args: Sequence[str] = (), router_args: Sequence[str] = (),
                          health_check_interval_s: int | None = None, name: str = "pod",
                          **engine_knobs: Any) -> RoutedFleet:
        """``count`` pods behind a real router (``kind``: ``smg`` or ``vllm-router``), once
        the router routes to every one of them:

        1. a free port for the router, so each coordinator can be told where it is before
           the router starts (the adapter calls it only when a drain starts);
        2. each pod (``add_routed_pod``'s steps 1-3, named ``{name}0``, ``{name}1``, ...);
        3. the router in front of the engines (``devstack.routers.start_router``), its
           health check every ``health_check_interval_s`` (None: the router's default, 60 s),
           ``router_args`` added to its command line.

        ``engine_knobs`` override ``ROUTED_ENGINE``; ``coordinator_args`` go to every
        coordinator (``--grace-period 12``, say)."""
        port = routers.free_port()
        url = f"http://127.0.0.1:{port}"
        knobs = {**ROUTED_ENGINE, **engine_knobs}
        pods = [self._routed_pod(f"{name}{i}", kind, url, adapter, coordinator_args, knobs)
                for i in range(count)]
        router = routers.start_router(kind, self._spawn_router, self.workdir,
                                      [p.engine.url for p in pods], *router_args, port=port,
                                      health_check_interval_s=health_check_interval_s)
        return RoutedFleet(router, pods, adapter, tuple(coordinator_args), knobs)

    def add_routed_pod(self, fleet: RoutedFleet, name: str, *,
                       prestarted: Prestarted | None = None, **engine_knobs: Any) -> Pod:
        """A new pod behind ``fleet``'s router (a rolling update's surge pod), returned once
        the router routes to it:

        1. a free port for the engine, so its coordinator knows the engine's URL as the
           router will (``--router-worker-url``) before the engine starts;
        2. the coordinator, with ``--router KIND=URL --router-worker-url ENGINE_URL`` when the
           fleet's adapters are on;
        3. the engine, registered with its coordinator (``start_pod``);
        4. the engine added to the router through its API (``RouterProcess.add_worker``).

        ``prestarted``: steps 1 and 2 were taken before (``prestart_routed_coordinator``)."""
        knobs = {**fleet.engine_knobs, **engine_knobs}
        pod = self._routed_pod(name, fleet.kind, fleet.router.url, fleet.adapter,
                               fleet.coordinator_args, knobs, prestarted)
        fleet.router.add_worker(pod.engine.url)
        fleet.pods.append(pod)
        return pod

    def start_continuation_proxy(self, upstream: str, coordinators: Sequence[str] = (),
                                 *args: str, name: str = "proxy") -> str:
        """``python -m continuation_proxy`` in front of ``upstream`` (a router's URL),
        acknowledging handoffs to ``coordinators``, on a free loopback port; its URL once it
        listens (it writes its ready file then)."""
        ready = self.workdir / f"{name}.json"
        ready.unlink(missing_ok=True)
        told = [arg for url in coordinators for arg in ("--coordinator", url)]
        proc = self.spawn([sys.executable, "-m", "continuation_proxy", "--upstream", upstream,
                           *told, "--port", "0", "--ready-file", str(ready), *args],
                          f"{name}.log")
        return _wait_for_json_url(proc, ready, name)

    def prestart_routed_coordinator(self, fleet: RoutedFleet, name: str) -> Prestarted:
        """The coordinator of a pod ``add_routed_pod`` will start later (``prestarted``):
        told of the fleet's router and of the engine's URL-to-be as that pod's would be,
        returned once it answers. The engine's port is picked now: another process could
        take it before the engine starts, which the engine's start then reports."""
        engine_url = f"http://127.0.0.1:{routers.free_port()}"
        args = _routed_args(fleet.kind, fleet.router.url, engine_url, fleet.adapter)
        coordinator = self.start_coordinator(f"{name}-coordinator", *args,
                                             *fleet.coordinator_args)
        return Prestarted(coordinator, engine_url)

    def _routed_pod(self, name: str, kind: str, router_url: str, adapter: bool,
                    coordinator_args: Sequence[str], knobs: dict[str, Any],
                    prestarted: Prestarted | None = None) -> Pod:
        if prestarted is not None:  # its coordinator was told all this when it started
            engine_url, args = prestarted.engine_url, []
        else:
            engine_url = f"http://127.0.0.1:{routers.free_port()}"
            args = [*_routed_args(kind, router_url, engine_url, adapter), *coordinator_args]
        pod = self.start_pod(name, args, request_log=True, together=True,
                             coordinator=prestarted.coordinator if prestarted else None,
                             **{**knobs, "port": int(engine_url.rsplit(":", 1)[1])})
        if pod.engine.url != engine_url:  # the router would know it by another name
            raise StackError(f"{name}'s engine listens on {pod.engine.url}, not {engine_url}")
        return pod

    def _spawn_router(self, argv: Sequence[str], log: Path,
                      env: dict[str, str]) -> subprocess.Popen[bytes]:
        return self.spawn(argv, log.name, env={**engine_environment(), **env})

    # -- ending ---------------------------------------------------------------------------

    async def close(self, timeout_s: float = 10.0) -> None:
        """End every process this stack started (and their descendants), in order: the
        router and the engines first, then the coordinators, which then have no stream or
        long-poll left open and stop at once, removing their doorbell pipes. Nothing starts
        from then on (``StackClosed``), so a start still running in a thread (the demo
        interrupted while its pods come up) cannot leave a process behind."""
        with self._starting:
            self._closing = True
        for coordinators in (False, True):
            targets = [Target(pid=p.pid, role="stack") for p in self._procs
                       if p.poll() is None and (p.pid in self._coordinators) is coordinators]
            if targets:
                await terminate(targets, KillPolicy(tier_timeout_s=timeout_s / 2,
                                                    deadline_s=timeout_s))
        for proc in self._procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _routed_args(kind: str, router_url: str, engine_url: str, adapter: bool) -> list[str]:
    """What a routed pod's coordinator is told of its router (nothing without the adapter)."""
    if not adapter:
        return []
    return ["--router", f"{kind}={router_url}", "--router-worker-url", engine_url]


def _registered(pod: Pod) -> bool:
    try:
        status = looks.get(pod.coordinator.url + "/status").json()
    except httpx.HTTPError:
        return False
    return any(w["pid"] == pod.engine.pid and w.get("connected") for w in status["workers"])


def _wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise StackError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _wait_for_json_url(proc: subprocess.Popen[bytes], path: Path, what: str) -> str:
    # Both the coordinator and the router write the file with a rename: absent or complete.
    def ready() -> bool:
        if proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode} before it was ready")
        return path.exists()

    _wait_until(ready, what)
    return str(json.loads(path.read_text())["url"])


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, what: str) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode}")
        try:
            return looks.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    _wait_until(healthy, what)


def run_close(stack: LocalStack) -> None:
    """``close()`` from synchronous code."""
    asyncio.run(stack.close())
