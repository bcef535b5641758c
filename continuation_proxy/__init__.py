"""A proxy clients point at instead of their router: streams a draining pod hands back are
continued through the same router, so the client sees one stream.

    python -m continuation_proxy --upstream http://smg:30000 --coordinator http://pod:8787

``POST /v1/completions`` and ``POST /v1/chat/completions`` go through
``router_client.ContinuingClient`` (docs/continuation.md); every other call is forwarded to
the upstream unchanged. A product package beside the coordinator: it imports
``router_client`` and the web stack (Starlette, uvicorn), never ``coordinator``,
``worker_client`` or ``devstack`` (tests/worker_client/test_imports.py holds this).
"""

from continuation_proxy.app import build_app
from continuation_proxy.bodies import Limits
from continuation_proxy.cli import main

__all__ = ["Limits", "build_app", "main"]
