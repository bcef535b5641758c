"""What ``serve`` loads before anything asks for it: no HTTP client. httpx (about 5 MB of a
coordinator's ~60 MB) is needed only by a drain that reads an engine's metrics, by router
adapters, and by a group's follower; each imports it when it is built or first used. Nor, in a
pod outside a group, the group's code and routes, nor the timeline's drawing code (served only
by ``GET /status/timeline``), nor the engine's metrics probe without ``--engine-metrics-url``,
nor the router adapters (and their retry library) without ``--router``:
each is CPU every pod of a rollout would pay at its start (``bench/start_cost.py``)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys

from coordinator import exit_codes
from coordinator.cli import main
from coordinator.service.server import bind, build_server
from coordinator.settings import Settings
from tests.service.servers import ROOT

LOADED = """
import json, sys
import coordinator.service.server, coordinator.service.runtime, coordinator.service.app
print(json.dumps(sorted(m for m in ("httpx", "httpcore", "pydantic_settings")
                        if m in sys.modules)))
"""


def test_the_service_starts_without_an_http_client() -> None:
    """1. A fresh interpreter imports the service's modules, as ``serve`` does.
    2. Neither httpx nor httpcore is loaded, nor a settings library (the settings read the
       environment themselves)."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    loaded = json.loads(done.stdout)
    assert loaded == [], loaded


BUILT = """
import json, sys
from coordinator.service.server import build_server
from coordinator.settings import Settings
build_server(Settings(**json.loads(sys.argv[1])))
print(json.dumps(sorted(m for m in sys.modules if m.startswith((
    "coordinator.group.", "coordinator.timeline", "coordinator.service.group_routes",
    "coordinator.service.engine_probe", "coordinator.service.router_adapters", "tenacity",
    "prometheus_client.parser")))))
"""
DEFERRED = ["coordinator.group.follower", "coordinator.group.leader", "coordinator.group.node",
            "coordinator.group.peer", "coordinator.service.engine_probe",
            "coordinator.service.group_routes", "coordinator.service.router_adapters",
            "coordinator.timeline", "prometheus_client.parser", "tenacity"]


def built_loads(**settings: object) -> list[str]:
    """The deferred modules a fresh interpreter holds once it built a server with
    ``settings`` (as ``serve`` does before it listens)."""
    done = subprocess.run([sys.executable, "-c", BUILT, json.dumps({"port": 0, **settings})],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith(("LWS_", "SHUTDOWN_COORDINATOR_"))})
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_a_pod_outside_a_group_builds_no_group_timeline_probe_or_router_code() -> None:
    """1. A fresh interpreter builds the server with the default settings (no group, no
       engine metrics URL, no router).
    2. None of the group's modules beyond its settings (``membership``), nor its routes, the
       timeline's drawing code, the engine probe or the router adapters, is loaded."""
    loaded = built_loads()
    assert not [m for m in loaded if m in DEFERRED or m.startswith("coordinator.timeline")], \
        loaded


def test_a_group_leader_with_a_probe_and_a_router_loads_what_it_needs() -> None:
    """The counterpart: a group's leader with an engine metrics URL and a router loads the
    group's node, its routes, the probe and the router adapters when the server is built,
    not on a first request."""
    loaded = built_loads(group_size=2, group_index=0, group_url="http://127.0.0.1:8787",
                         engine_metrics_url="http://127.0.0.1:9/metrics",
                         routers=["smg=http://127.0.0.1:9"],
                         router_worker_url="http://127.0.0.1:8000")
    assert {"coordinator.group.node", "coordinator.service.group_routes",
            "coordinator.service.engine_probe", "prometheus_client.parser",
            "coordinator.service.router_adapters", "tenacity"} <= set(loaded), loaded
    assert not [m for m in loaded if m.startswith("coordinator.timeline")], loaded


def test_serve_collects_no_garbage_until_it_listens_then_does() -> None:
    """1. With the collector off (as ``serve`` turns it off before its imports), a server
       starts: once it listens the collector is on, and what the start made is frozen out
       of its reach.
    2. The server stops; the test's process gets its collector as it was."""
    gc.disable()
    try:
        server = build_server(Settings(port=0))
        sock = bind("127.0.0.1", 0)

        async def start_and_stop() -> tuple[bool, int]:
            listening = asyncio.Event()
            seen: list[tuple[bool, int]] = []
            startup = server.startup

            async def startup_then_look(sockets: list[socket.socket] | None = None) -> None:
                await startup(sockets=sockets)
                seen.append((gc.isenabled(), gc.get_freeze_count()))
                listening.set()

            server.startup = startup_then_look  # type: ignore[method-assign]
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            looked = asyncio.create_task(listening.wait())
            await asyncio.wait({serving, looked}, return_when=asyncio.FIRST_COMPLETED)
            looked.cancel()
            server.should_exit = True
            await serving
            return seen[0]

        enabled, frozen = asyncio.run(start_and_stop())
    finally:
        gc.unfreeze()
        gc.enable()
    assert server.started
    assert enabled
    assert frozen > 0


def test_a_refused_start_leaves_the_collector_on() -> None:
    """``serve`` refusing its settings returns with the collector on, in a process that goes
    on (here, the test's)."""
    assert main(["serve", "--port", "70000"]) == exit_codes.USAGE
    assert gc.isenabled()
