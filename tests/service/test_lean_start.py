"""What ``serve`` loads before anything asks for it: no HTTP client, no timeline drawing.

httpx (about 5 MB of a coordinator's ~60 MB, and with a client's TLS context about 70 ms of
its start) is needed only by a drain that reads an engine's metrics, by router adapters, and
by a group's follower; each imports it when it is built or first used, and the router
adapters build their client in a worker thread once the coordinator runs
(``RouterAdapters.start``), not while it is built. The timeline's drawing code is loaded by
the first ``GET /status/timeline``."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.service.servers import ROOT
from tests.support.processes import ProcessJanitor

LOADED = """
import json, sys
import coordinator.service.server, coordinator.service.runtime, coordinator.service.app
print(json.dumps(sorted(m for m in ("httpx", "httpcore") if m in sys.modules)))
"""

BUILT_WITH_A_ROUTER = """
import json, sys
from coordinator.service.server import build_server
from coordinator.settings import Settings
build_server(Settings(port=0, routers=["smg=http://127.0.0.1:9"],
                      router_worker_url="http://127.0.0.1:9"))
print(json.dumps(sorted(m for m in ("httpx", "httpcore", "coordinator.timeline")
                        if m in sys.modules)))
"""


def test_the_service_starts_without_an_http_client() -> None:
    """1. A fresh interpreter imports the service's modules, as ``serve`` does.
    2. Neither httpx nor httpcore is loaded."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    loaded = json.loads(done.stdout)
    assert loaded == [], loaded


def test_a_coordinator_told_of_a_router_is_built_without_httpx_or_the_timeline(
        janitor: ProcessJanitor) -> None:
    """1. A fresh interpreter builds the server of a coordinator told of smg (``--router``,
    ``--router-worker-url``), as ``serve`` does before it serves.
    2. Neither httpx nor httpcore is loaded, nor the timeline's drawing code."""
    proc = janitor.spawn_python(["-c", BUILT_WITH_A_ROUTER], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    loaded = json.loads(out)
    assert loaded == [], loaded
