"""Start the real things the engine tests need: engines from .engines/, and a coordinator.

Every process goes through the test's janitor, in its own session, and logs to a file under
the test's tmp_path (shown when a wait fails, since an engine that fails to start says why
only in its log).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from devstack.routers import free_port, log_tail
from tests.service.servers import Running
from tests.service.servers import start_coordinator as start_service
from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[2]
ENGINES = Path(os.environ.get("ENGINES_DIR", ROOT / ".engines"))
if not ENGINES.is_absolute():
    ENGINES = ROOT / ENGINES

VLLM_START_S = 420.0
"""Bound on vLLM's start (about 50-60 s on 2 idle cores; far more under a loaded CI)."""
DYNAMO_START_S = 120.0
LOOPBACK_ENV = {
    # Dynamo binds its request, response and event planes to the host's own address unless
    # told otherwise; tests keep all their traffic on loopback.
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
}


def engine_python(engine: str) -> Path:
    """The interpreter of an engine's virtualenv; skips the test when it is not installed."""
    python = ENGINES / engine / "bin" / "python"
    if not (ENGINES / engine / ".installed").exists():
        pytest.skip(f"{engine} is not installed: run scripts/engines.sh {engine}")
    return python


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http(
    url: str, proc: subprocess.Popen[Any], log: Path, *, timeout: float, what: str
) -> None:
    """Wait until ``url`` answers 200; fail at once (with the log) if ``proc`` exits first."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}:\n{log_tail(log)}")
        return http_ok(url)

    try:
        wait_for(ready, timeout=timeout, interval=0.25, what=what)
    except AssertionError as exc:
        if "timed out" in str(exc):
            raise AssertionError(f"{exc}\n{log_tail(log)}") from None
        raise


def spawn_logged(
    janitor: ProcessJanitor, argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[Any]:
    with log.open("ab") as handle:
        return janitor.spawn(argv, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)


Coordinator = Running
"""The coordinator process an engine test owns (started by ``start_coordinator``)."""


def start_coordinator(janitor: ProcessJanitor, tmp: Path, *args: str,
                      source: Path = ROOT) -> Coordinator:
    """Start the coordinator (from .venv; ``source``: the checkout whose package runs) on a
    free loopback port and wait for ``/healthz``."""
    return start_service(janitor, tmp, *args, source=source)


def peer_core_env() -> dict[str, str]:
    """The environment that binds a vLLM nothing drains (a peer streams continue on) to the
    last core this process may use, where there are two or more.

    vLLM's CPU backend binds each Worker to the first core of its NUMA node
    (``VLLM_CPU_OMP_THREADS_BIND=auto``): every vLLM on this machine to core 0. A Worker's exit
    is seconds of garbage collection on that core; beside a peer's Worker generating the
    continued streams on the same core, a drained Worker took longer than the 60 s EngineCore
    gives it (EngineCore then SIGKILLed it). In a cluster each engine has its own cores."""
    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[-1])} if len(cores) > 1 else {}


@dataclass
class Vllm:
    """A vLLM OpenAI server on the tiny model."""

    proc: subprocess.Popen[Any]
    url: str
    log: Path
    served_model: str


def start_vllm(
    janitor: ProcessJanitor, tmp: Path, model_dir: Path, argv: list[str] | None = None,
    max_model_len: int = 512, served_model: str = "tiny", flags: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None, port: int | None = None,
) -> Vllm:
    """Start an unmodified vLLM (``vllm.entrypoints.openai.api_server``) and wait until healthy.

    ``argv`` replaces the module to run (an example server that wraps vLLM) and receives the
    same engine flags; ``flags`` are added to them; ``extra_env`` (a container's own ``env``)
    is added to the environment; ``port``: a free one by default.
    """
    python = engine_python("vllm")
    port = port or free_port()
    log = tmp / f"vllm-{port}.log"
    module = argv or ["-m", "vllm.entrypoints.openai.api_server"]
    engine_flags = [
        "--model", str(model_dir), "--served-model-name", served_model,
        "--load-format", "dummy", "--max-model-len", str(max_model_len),
        # Reserve a fixed KV cache: the default reserves a fraction of all memory and refuses
        # to start when other processes use some of it.
        "--kv-cache-memory-bytes", str(256 * 2**20),
        "--host", "127.0.0.1", "--port", str(port), *flags,
    ]
    env = {"VLLM_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           **(extra_env or {})}
    proc = spawn_logged(janitor, [str(python), *module, *engine_flags], log, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, log, timeout=VLLM_START_S, what="vLLM healthy")
    return Vllm(proc=proc, url=url, log=log, served_model=served_model)


def tree(pid: int) -> dict[int, str]:
    """PID → process name (the title an engine set) of ``pid`` and its live descendants."""
    found: dict[int, str] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for proc in procs:
        try:
            cmdline = proc.cmdline()
            found[proc.pid] = cmdline[0] if cmdline and "::" in cmdline[0] else proc.name()
        except psutil.Error:
            continue
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (zombies waiting to be reaped count as ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def pattern_for(path: Path) -> str:
    """A regex matching command lines that name ``path`` (so tests adopt only their engine)."""
    return re.escape(str(path))
