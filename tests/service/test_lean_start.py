"""What ``serve`` loads before anything asks for it: no HTTP client. httpx (about 5 MB of a
coordinator's ~60 MB) is needed only by a drain that reads an engine's metrics, by router
adapters, and by a group's follower; each imports it when it is built or first used."""

from __future__ import annotations

import json
import subprocess
import sys

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
