"""Start the simulated engine from tests, the demo and benchmarks, and read what happened.

    handle = start_engine(janitor.spawn, tmp_path / "records", teardown_s=0.5)
    httpx.post(f"{handle.url}/v1/completions", ...)
    ...
    handle.records()        # how each process ended

``spawn`` is anything that takes an argv list and an ``env`` keyword and returns a
Popen-like object (the tests' ``janitor.spawn``, or ``subprocess.Popen``). With ``spawn=None``
the engine is started in its own session, so a terminal's Ctrl-C reaches only the caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from devstack.sim.errors import SimStartupError
from devstack.sim.knobs import EngineKnobs
from devstack.sim.records import read_records

READY_FILE_NAME = "ready.json"
DEFAULT_READY_TIMEOUT_S = 60.0
"""Bounds a failed start only: a healthy engine with two schedulers is up in well under a
second, but a loaded 2-core CI machine can take many times that to start Python processes."""
_POLL_INTERVAL_S = 0.01


class PopenLike(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


SpawnFn = Callable[..., PopenLike]
"""Called as ``spawn(argv, env=full_environment)``."""


@dataclass(frozen=True)
class SimProcess:
    """One process of the engine as the ready file lists it."""

    pid: int
    role: str
    ppid: int
    rank: int | None = None


@dataclass
class EngineHandle:
    """A running simulated engine."""

    proc: PopenLike
    record_dir: Path
    ready: dict[str, Any]
    processes: list[SimProcess] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return int(self.ready["pid"])

    @property
    def port(self) -> int:
        return int(self.ready["port"])

    @property
    def url(self) -> str:
        return str(self.ready["url"])

    def pids(self, role: str) -> list[int]:
        """PIDs of the processes with this role, in start order."""
        return [p.pid for p in self.processes if p.role == role]

    def records(self) -> list[dict[str, Any]]:
        """Every end record written so far (see ``devstack.sim.records``)."""
        return read_records(self.record_dir)

    def record_of(self, pid: int) -> dict[str, Any] | None:
        """The end record of one process, or None if it wrote none."""
        path_matches = self.record_dir.glob(f"*-{pid}.json")
        for path in path_matches:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        return None


def engine_argv(record_dir: Path, ready_file: Path, knobs: EngineKnobs) -> list[str]:
    """The command line that starts the engine with these knobs."""
    return [
        sys.executable,
        "-m",
        "devstack.sim",
        "--record-dir",
        str(record_dir),
        "--ready-file",
        str(ready_file),
        *knobs.to_argv(),
    ]


@dataclass(frozen=True)
class EngineLaunch:
    """An engine started but maybe not up yet (``launch_engine``): the pods of a multi-node
    engine come up together, each waiting for the others to join its collective."""

    proc: PopenLike
    record_dir: Path
    ready_file: Path

    def wait_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> EngineHandle:
        """Return once the engine wrote its ready file; ``SimStartupError`` when it exits
        first or ``timeout_s`` passes."""
        ready = _wait_for_ready_file(self.proc, self.ready_file, timeout_s)
        processes = [
            SimProcess(pid=p["pid"], role=p["role"], ppid=p["ppid"], rank=p.get("rank"))
            for p in ready["processes"]
        ]
        return EngineHandle(proc=self.proc, record_dir=self.record_dir, ready=ready,
                            processes=processes)


def start_engine(
    spawn: SpawnFn | None,
    record_dir: Path | str,
    knobs: EngineKnobs | None = None,
    *,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    **overrides: Any,
) -> EngineHandle:
    """Start the engine and return once it serves HTTP and every child is up.

    ``overrides`` are ``EngineKnobs`` fields (``teardown_s=1.0``, ``dp=2`` ...). Raises
    ``SimStartupError`` when the engine exits first or is not ready in ``ready_timeout_s``.
    """
    return launch_engine(spawn, record_dir, knobs, **overrides).wait_ready(ready_timeout_s)


def launch_engine(
    spawn: SpawnFn | None,
    record_dir: Path | str,
    knobs: EngineKnobs | None = None,
    *,
    argv_prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> EngineLaunch:
    """Start the engine without waiting for it. ``argv_prefix`` goes before the command
    (``ip netns exec NAME`` puts it in a network namespace); ``env`` adds to its
    environment (a pod's ``LWS_*`` variables)."""
    knobs = replace(knobs or EngineKnobs(), **overrides)
    record_dir = Path(record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    ready_file = record_dir / READY_FILE_NAME
    ready_file.unlink(missing_ok=True)
    argv = [*argv_prefix, *engine_argv(record_dir, ready_file, knobs)]
    full_env = {**engine_environment(), **(env or {})}
    proc = spawn(argv, env=full_env) if spawn is not None else _popen_new_session(argv, full_env)
    return EngineLaunch(proc=proc, record_dir=record_dir, ready_file=ready_file)


def engine_environment() -> dict[str, str]:
    """This environment, with the directory holding ``devstack`` (and, beside it in the same
    distribution, ``worker_client``) first on PYTHONPATH so ``python -m devstack.sim`` works
    from any working directory, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _popen_new_session(argv: Sequence[str], env: dict[str, str]) -> PopenLike:
    return subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_for_ready_file(proc: PopenLike, ready_file: Path, timeout_s: float) -> dict[str, Any]:
    # The engine writes the file with a rename, so it is either absent or complete.
    deadline = time.monotonic() + timeout_s
    while True:
        if ready_file.exists():
            data: dict[str, Any] = json.loads(ready_file.read_text())
            return data
        code = proc.poll()
        if code is not None:
            raise SimStartupError(f"the engine exited with {code} before it was ready")
        if time.monotonic() > deadline:
            raise SimStartupError(f"the engine was not ready after {timeout_s}s")
        time.sleep(_POLL_INTERVAL_S)
