"""Start the real routers (SGLang Model Gateway ``smg``, ``vllm-router``) in front of
simulated engines, from the virtualenv ``scripts/engines.sh routers`` makes under .engines/.

``devstack.routers`` starts them; here each one runs through the test's janitor as a service
(SIGTERM at the end, exit 0, nothing of its tree left behind), logging to a file under the
test's tmp_path that a failed wait shows.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from devstack import routers
from devstack.routers import RouterProcess
from tests.engines.stack import spawn_logged
from tests.support.processes import ProcessJanitor

ROUTERS = routers.KINDS
STOP_WITHIN_S = routers.STOP_TIMEOUT_S


class Router(RouterProcess):
    """A router the test started; ``name`` is its kind."""

    @property
    def name(self) -> str:
        return self.kind


def router_binary(name: str) -> Path:
    """A router's executable; skips the test when the routers are not installed."""
    if not routers.installed():
        pytest.skip("the routers are not installed: run scripts/engines.sh routers")
    return routers.router_binary(name)


def janitor_spawn(janitor: ProcessJanitor) -> routers.Spawn:
    """``devstack.routers``' spawn through ``janitor``: every router a service of the test
    (SIGTERM at its end, must exit 0 within ``STOP_WITHIN_S``)."""

    def spawn(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
        proc = spawn_logged(janitor, list(argv), log, env=env)
        janitor.service(proc, stop_within_s=STOP_WITHIN_S)
        return proc

    return spawn


def smg_workers(router: RouterProcess) -> list[dict[str, Any]]:
    """``GET /workers`` of an smg router: every worker with its ``url``, ``id``, ``status``."""
    body = routers.get_json(f"{router.url}/workers")
    return list(body["workers"]) if body else []


def start_router(name: str, janitor: ProcessJanitor, tmp: Path, workers: list[str],
                 *args: str, health_check_interval_s: int | None = None) -> Router:
    """``name`` round robin in front of ``workers``, once it routes to every one of them."""
    router_binary(name)
    started = routers.start_router(name, janitor_spawn(janitor), tmp, workers, *args,
                                   health_check_interval_s=health_check_interval_s)
    return Router(**{f.name: getattr(started, f.name) for f in fields(started)})
