"""The chaos soak's fleet (``bench/soak.py``): pods that keep their URLs across restarts.

Each pod is a coordinator (token, state file) and a simulated engine registered with it;
the reference router is in front of all of them with a static ``--worker
ENGINE_URL=COORDINATOR_URL`` list, so every restart reuses the same loopback port: a fresh
engine after each drain, a coordinator restarted on its state file, the router itself. The
ports are picked below the kernel's ephemeral range, so no outgoing connection of another
program takes one while its owner restarts.

Each pod's engine runs in a unit of its own, as a container's does: a cgroup v2 (else a mount
namespace). A process that daemonizes leaves its tree, session and group but not its unit,
so the coordinator can still find it, and the soak counts what is left in the unit after a
drain from the kernel's own list.

This process is a child subreaper (``PR_SET_CHILD_SUBREAPER``): the engine processes that
are orphaned (a daemon, the children of a crashed main process) become its children, so
their exit status is known here and no zombie of ours is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack.local_stack import CoordinatorProcess, LocalStack, Pod
from devstack.sim.launcher import EngineHandle, start_engine
from devstack.sim.linux import wait_for_exits

HOST = "127.0.0.1"
PORT_RANGE = (20000, 32000)
"""Below Linux's default ephemeral range (32768-60999)."""
CGROUP_V2 = Path("/sys/fs/cgroup/unified")
PR_SET_CHILD_SUBREAPER = 36
STATUS_TIMEOUT_S = 60.0
ENGINE_START_ATTEMPTS = 3
COORDINATOR_ARGS = ("--grace-period", "30", "--tier-timeout", "5", "--confirm-timeout", "2",
                    "--prekill-timeout", "2")
"""The default 25 s budget; tiers of 5 s, not 10, so a SIGTERM-ignoring child costs less,
yet long enough for a process to end when the machine stalls for a second or two (with
2 s, one drain in a thousand needed SIGKILL for a process that had finished its cleanup)."""
ENGINE_KNOBS: dict[str, Any] = {"graceful_main": True, "token_interval_ms": 20.0,
                                "teardown_s": 0.05}


class RigError(RuntimeError):
    """The fleet could not be set up or restarted."""


# --- this process ---------------------------------------------------------------------------


def become_subreaper() -> None:
    """Orphans of the processes this one starts become its children (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap(pid: int) -> int | None:
    """The exit code of ``pid`` if it is a finished child of ours (reaping it), else None.
    Only for processes no ``Popen`` holds: the engines' orphans."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if got == pid else None


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that nothing listens on now."""
    rng = random.SystemRandom()
    found: list[int] = []
    while len(found) < count:
        port = rng.randrange(*PORT_RANGE)
        if port in found:
            continue
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind((HOST, port))
            found.append(port)
    return found


# --- units ----------------------------------------------------------------------------------


@dataclass
class Unit:
    """Where a pod's engine runs: a cgroup v2 of its own, a mount namespace, or nothing."""

    kind: str
    prefix: list[str]
    """Prepend to an argv to start it in the unit (the same PID: ``exec``)."""
    cgroup: Path | None = None

    def members(self) -> list[int]:
        """PIDs in the unit now (cgroup only: a mount namespace has no list)."""
        if self.cgroup is None:
            return []
        try:
            return [int(line) for line in (self.cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


def make_unit(kind: str, name: str) -> Unit:
    """A unit of ``kind`` (``auto``: a cgroup if it can be made, else a mount namespace)."""
    if kind in ("auto", "cgroup"):
        path = CGROUP_V2 / f"shutdown-coordinator-soak-{name}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError as exc:
            if kind == "cgroup":
                raise RigError(f"cannot make a cgroup under {CGROUP_V2}: {exc}") from exc
        else:
            return Unit("cgroup", ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"',
                                   str(path)], path)
    if kind in ("auto", "mntns") and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return Unit("mntns", ["unshare", "-m", "--propagation", "private"])
    if kind in ("auto", "none"):
        return Unit("none", [])
    raise RigError(f"no {kind} unit can be made here")


# --- the fleet ------------------------------------------------------------------------------


@dataclass
class SoakPod:
    """One pod: its coordinator, its current engine, and the ports both keep."""

    index: int
    name: str
    unit: Unit
    engine_port: int
    coordinator_port: int
    state_file: Path
    coordinator: CoordinatorProcess
    knobs: dict[str, Any]
    """The pod's own engine shape: pod 0 a data-parallel controller with its scheduler (a
    PDEATHSIG grandchild), the others a scheduler; each a detokenizer."""
    engine: EngineHandle | None = None
    engines_started: int = 0
    coordinator_restarts: int = 0
    start_ticks: dict[int, int] = field(default_factory=dict)
    """Start ticks of the current engine's processes, read when it came up."""

    def current_engine(self) -> EngineHandle:
        if self.engine is None:
            raise RigError(f"{self.name} has no engine")
        return self.engine

    def as_pod(self) -> Pod:
        """The ``LocalStack`` view (for the router's worker list)."""
        return Pod(self.name, self.coordinator, self.current_engine())


class Fleet:
    """The pods and the router; ``close()`` ends every process the soak started."""

    def __init__(self, workdir: Path, pods: int, unit_kind: str) -> None:
        self.workdir = workdir
        self.stack = LocalStack(workdir)
        self.token = secrets.token_hex(16)
        self.token_file = workdir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.count = pods
        self.unit_kind = unit_kind
        self.pods: list[SoakPod] = []
        self.units: list[Unit] = []
        self.router_port = 0
        self.router_url = ""
        self.router_restarts = 0

    # -- start ----------------------------------------------------------------------------

    def start(self, first_knobs: Sequence[dict[str, Any]]) -> None:
        """Every pod (coordinator, then an engine with ``first_knobs[i]``), then the router."""
        ports = free_ports(2 * self.count + 1)
        self.router_port = ports.pop()
        self.units = [make_unit(self.unit_kind, f"pod{i}") for i in range(self.count)]
        with ThreadPoolExecutor(self.count) as pool:  # the pods start side by side
            self.pods = list(pool.map(lambda i: self._start_pod(i, ports, first_knobs[i]),
                                      range(self.count)))
        self.router_url = self.stack.start_router([p.as_pod() for p in self.pods], "--token",
                                                  self.token, port=self.router_port)

    def _start_pod(self, i: int, ports: list[int], knobs: dict[str, Any]) -> SoakPod:
        name = f"pod{i}"
        state = self.workdir / f"{name}.state.json"
        coordinator = self.stack.start_coordinator(
            f"{name}-coordinator", *self.coordinator_args(state), port=ports[2 * i + 1])
        pod = SoakPod(i, name, self.units[i], ports[2 * i], ports[2 * i + 1],
                      state, coordinator, knobs={"dp": 1} if i == 0 else {"schedulers": 1})
        self.start_engine(pod, knobs)
        return pod

    def coordinator_args(self, state: Path) -> list[str]:
        return ["--token-file", str(self.token_file), "--state-file", str(state),
                *COORDINATOR_ARGS]

    def start_engine(self, pod: SoakPod, knobs: dict[str, Any]) -> EngineHandle:
        """A fresh engine on the pod's port, in its unit, registering with its coordinator
        (returns once it is up; registration is awaited with ``wait_registered``)."""
        pod.engines_started += 1
        record_dir = self.workdir / pod.name / f"engine-{pod.engines_started:05d}"

        def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            return self.stack.spawn([*pod.unit.prefix, *argv], f"{pod.name}-engine.log",
                                    env=env)

        last: Exception | None = None
        for _ in range(ENGINE_START_ATTEMPTS):
            try:
                engine = start_engine(
                    spawn, record_dir, coordinator=pod.coordinator.url,
                    coordinator_token_file=str(self.token_file), port=pod.engine_port,
                    **{**ENGINE_KNOBS, **pod.knobs, **knobs})
            except Exception as exc:  # the port may be held a moment longer: again
                last = exc
                continue
            pod.engine = engine
            pod.start_ticks = {p.pid: ticks for p in engine.processes
                               if (ticks := start_ticks(p.pid)) is not None}
            return engine
        raise RigError(f"{pod.name}: the engine did not start: {last}")

    def restart_coordinator(self, pod: SoakPod) -> CoordinatorProcess:
        """Start the pod's coordinator again, same port, same state file."""
        pod.coordinator_restarts += 1
        coordinator = self.stack.start_coordinator(
            f"{pod.name}-coordinator", *self.coordinator_args(pod.state_file),
            port=pod.coordinator_port)
        pod.coordinator = coordinator
        return coordinator

    def stop_router(self) -> int:
        """SIGTERM the router; its exit code once every stream it carried has ended."""
        router = self.stack.router
        if router is None:
            raise RigError("no router")
        router.send_signal(signal.SIGTERM)
        return router.wait(timeout=STATUS_TIMEOUT_S)

    def start_router(self) -> str:
        self.router_restarts += 1
        url = self.stack.start_router([p.as_pod() for p in self.pods], "--token", self.token,
                                      port=self.router_port)
        if url != self.router_url:
            raise RigError(f"the router came back at {url}, not {self.router_url}")
        return url

    # -- end ------------------------------------------------------------------------------

    async def close(self) -> None:
        """End every process the soak started (router and engines, then coordinators), and
        whatever is still in the pods' units, by PID; remove the units."""
        await self.stack.close()
        for unit in self.units:
            left = unit.members()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(wait_for_exits, left, 10.0)
            for pid in left:
                reap(pid)
        for pod in self.pods:
            for pid in pod.start_ticks:
                reap(pid)
        for unit in self.units:
            unit.remove()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot, or None when it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state first), or None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


# --- talking to the coordinators ------------------------------------------------------------


async def status(http: httpx.AsyncClient, url: str, **params: Any) -> dict[str, Any]:
    response = await http.get(f"{url}/status", params=params)
    response.raise_for_status()
    document: dict[str, Any] = response.json()
    return document


async def wait_status(http: httpx.AsyncClient, url: str,
                      predicate: Callable[[dict[str, Any]], bool], what: str,
                      timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
    """Long-poll ``url``'s ``/status`` until ``predicate`` holds (a restarting coordinator
    may not answer for a moment); raises ``RigError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    generation: int | None = None
    while (left := deadline - time.monotonic()) > 0:
        params: dict[str, Any] = {}
        if generation is not None:
            params = {"wait": min(left, 5.0), "since": generation}
        try:
            document = await status(http, url, **params)
        except httpx.HTTPError:
            generation = None
            await asyncio.sleep(0.05)
            continue
        if predicate(document):
            return document
        generation = int(document["generation"])
    raise RigError(f"timed out after {timeout_s:.0f} s waiting for {what} at {url}")


def registered(pid: int) -> Callable[[dict[str, Any]], bool]:
    """``/status`` says the pod serves with ``pid`` registered and its events stream open."""
    def check(document: dict[str, Any]) -> bool:
        return document["phase"] == "serving" and any(
            w["pid"] == pid and w.get("connected") for w in document["workers"])
    return check
