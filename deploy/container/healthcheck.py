"""Container health check: the coordinator answers ``GET /healthz`` with 200.

Runs inside the coordinator's own container (Docker ``HEALTHCHECK``), standard library only.
It reaches the coordinator where ``serve`` listens: ``SHUTDOWN_COORDINATOR_HOST`` (a wildcard
address means loopback) and ``SHUTDOWN_COORDINATOR_PORT``. Exit 0 healthy, 1 not.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = "8787"
TIMEOUT_S = 2.0
WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def healthz_url() -> str:
    host = os.environ.get("SHUTDOWN_COORDINATOR_HOST", "127.0.0.1").strip()
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = os.environ.get("SHUTDOWN_COORDINATOR_PORT", DEFAULT_PORT).strip() or DEFAULT_PORT
    return f"http://{host}:{port}/healthz"


def main() -> int:
    url = healthz_url()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            healthy = response.status == 200
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}")
        return 1
    if not healthy:
        print(f"unhealthy: {url}: HTTP {response.status}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
