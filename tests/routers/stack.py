"""Start the real routers (SGLang Model Gateway ``smg``, ``vllm-router``) in front of
simulated engines, from the virtualenv ``scripts/engines.sh routers`` makes under .engines/.

Each router runs through the test's janitor as a service (SIGTERM at the end, exit 0, nothing
of its tree left behind), on loopback ports found free a moment before (neither router reports
a port 0 bind), logging to a file under the test's tmp_path that a failed wait shows.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines.stack import ENGINES, free_port, log_tail, spawn_logged
from tests.support.processes import ProcessJanitor, wait_for

ROUTERS = ("smg", "vllm-router")
START_S = 60.0
"""Bound on a router's start with its workers registered (about 1 s on 2 idle cores)."""
STOP_WITHIN_S = 10.0
"""A router's stop on SIGTERM: smg keeps its listener open for min(grace / 2, 5 s) first."""
SMG_SHUTDOWN_GRACE_S = 2
"""``smg --shutdown-grace-period-secs``: its default (180 s, of which 5 s of settle before
it stops listening) would make every test wait on the router's stop."""


def router_binary(name: str) -> Path:
    """A router's executable; skips the test when the routers are not installed."""
    venv = ENGINES / "routers"
    if not (venv / ".installed").exists():
        pytest.skip("the routers are not installed: run scripts/engines.sh routers")
    return venv / "bin" / name


@dataclass
class Router:
    """A router process in front of ``workers``."""

    name: str
    proc: subprocess.Popen[Any]
    url: str
    log: Path
    workers: list[str]

    def log_tail(self) -> str:
        return log_tail(self.log)


def _get_json(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _wait(router: Router, ready: Callable[[], bool]) -> None:
    def check() -> bool:
        if router.proc.poll() is not None:
            raise AssertionError(f"{router.name} exited {router.proc.returncode}:\n"
                                 f"{router.log_tail()}")
        return ready()

    try:
        wait_for(check, timeout=START_S, interval=0.05,
                 what=f"{router.name} with {len(router.workers)} workers ready")
    except AssertionError as exc:
        if "timed out" in str(exc):
            raise AssertionError(f"{exc}\n{router.log_tail()}") from None
        raise


def smg_workers(router: Router) -> list[dict[str, Any]]:
    """``GET /workers`` of an smg router: every worker with its ``url``, ``id``, ``status``."""
    body = _get_json(f"{router.url}/workers")
    return list(body["workers"]) if body else []


def start_smg(janitor: ProcessJanitor, tmp: Path, workers: list[str], *args: str) -> Router:
    """``smg launch`` round-robin in front of ``workers``; returns once every worker is
    registered and ``ready`` (smg probes each one: ``/health``, then ``/v1/models`` and the
    SGLang info endpoints to detect the backend)."""
    port, metrics_port = free_port(), free_port()
    log = tmp / f"smg-{port}.log"
    argv = [
        str(router_binary("smg")), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *workers, "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--shutdown-grace-period-secs", str(SMG_SHUTDOWN_GRACE_S), "--log-level", "debug",
        *args,
    ]  # fmt: skip
    router = Router("smg", spawn_logged(janitor, argv, log, env={"NO_COLOR": "1"}),
                    f"http://127.0.0.1:{port}", log, workers)
    janitor.service(router.proc, stop_within_s=STOP_WITHIN_S)

    def ready() -> bool:
        listed = smg_workers(router)
        return sorted(w["url"] for w in listed if w.get("status") == "ready") == sorted(workers)

    _wait(router, ready)
    return router


def start_vllm_router(
    janitor: ProcessJanitor, tmp: Path, workers: list[str], *args: str
) -> Router:
    """``vllm-router`` round-robin in front of ``workers``; it checks each worker's
    ``/health`` before it listens, so ``/list_workers`` naming them all means ready."""
    port, metrics_port = free_port(), free_port()
    log = tmp / f"vllm-router-{port}.log"
    argv = [
        str(router_binary("vllm-router")), "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *workers, "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", "debug", *args,
    ]  # fmt: skip
    router = Router("vllm-router", spawn_logged(janitor, argv, log, env={"NO_COLOR": "1"}),
                    f"http://127.0.0.1:{port}", log, workers)
    janitor.service(router.proc, stop_within_s=STOP_WITHIN_S)

    def ready() -> bool:
        listed = _get_json(f"{router.url}/list_workers")
        return bool(listed) and sorted(listed.get("urls", [])) == sorted(workers)

    _wait(router, ready)
    return router


def start_router(name: str, janitor: ProcessJanitor, tmp: Path, workers: list[str]) -> Router:
    starters = {"smg": start_smg, "vllm-router": start_vllm_router}
    return starters[name](janitor, tmp, workers)
