"""Run pods on one machine: coordinators, simulated engines and the reference router.

The demo and the benchmarks need the same pieces a cluster has — one coordinator per pod next
to its engine, a router in front — as real processes on loopback ports. ``LocalStack`` starts
them, each in its own session, and ``close()`` ends every one of them with the project's own
kill engine (SIGTERM in order, SIGKILL for stragglers), so nothing outlives the stack.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from coordinator.kill import KillPolicy, Target, terminate
from devstack.sim.launcher import EngineHandle, engine_environment, start_engine

START_TIMEOUT_S = 60.0
"""Bounds a failed start only; a healthy coordinator answers in well under a second."""


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


class LocalStack:
    """Processes of a local pod fleet; every one of them ends in ``close()``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: list[subprocess.Popen[bytes]] = []
        self._coordinators: set[int] = set()
        self.router: subprocess.Popen[bytes] | None = None
        """The router ``start_router`` started last."""

    # -- starting -------------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], log_name: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own, its output appended to ``log_name``; it
        ends in ``close()`` like every other process of the stack."""
        log: IO[bytes] = (self.workdir / log_name).open("ab")
        try:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=kwargs.pop("env", engine_environment()), **kwargs,
            )
        finally:
            log.close()
        self._procs.append(proc)
        return proc

    def start_coordinator(self, name: str, *args: str, port: int = 0) -> CoordinatorProcess:
        """``shutdown-coordinator serve`` on a loopback port (0: a free one); returns once it
        answers. A restart on the same ``port`` keeps the URL routers and engines know."""
        port_file = self.workdir / f"{name}.port.json"
        port_file.unlink(missing_ok=True)
        proc = self.spawn(
            [sys.executable, "-m", "coordinator", "serve", "--port", str(port),
             "--port-file", str(port_file), "--log-level", "warning", *args],
            f"{name}.log",
        )
        self._coordinators.add(proc.pid)
        url = _wait_for_json_url(proc, port_file, f"coordinator {name}")
        _wait_healthy(proc, url + "/healthz", f"coordinator {name}")
        return CoordinatorProcess(proc, url, self.workdir / f"{name}.log")

    def start_pod(self, name: str, coordinator_args: Sequence[str] = (),
                  **engine_knobs: Any) -> Pod:
        """A coordinator, then an engine that registers with it (waits for the registration)."""
        coordinator = self.start_coordinator(f"{name}-coordinator", *coordinator_args)

        def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            return self.spawn(argv, f"{name}-engine.log", env=env)

        engine = start_engine(spawn, self.workdir / f"{name}-records",
                              coordinator=coordinator.url, **engine_knobs)
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

    # -- ending ---------------------------------------------------------------------------

    async def close(self, timeout_s: float = 10.0) -> None:
        """End every process this stack started (and their descendants), in order: the
        router and the engines first, then the coordinators, which then have no stream or
        long-poll left open and stop at once, removing their doorbell pipes."""
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


def _registered(pod: Pod) -> bool:
    try:
        status = httpx.get(pod.coordinator.url + "/status", timeout=5).json()
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
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    _wait_until(healthy, what)


def run_close(stack: LocalStack) -> None:
    """``close()`` from synchronous code."""
    asyncio.run(stack.close())
