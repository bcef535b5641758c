"""The public address: only the routes that never need a token are served there.

``--public-host POD_IP`` makes the server listen on a second address, with the same port, so
that the kubelet's probes and Prometheus (which reach a pod at its IP) find ``/healthz``,
``/readyz`` and ``/metrics`` while the API itself stays on loopback, where the engine in the
same network namespace reaches it without a token. The gate wraps the whole application
and looks at the address each connection arrived on (its local address, as uvicorn reports
it in ``scope["server"]``): on the public one, any other path is refused with a 403 before
the application sees the request.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""The routes the contract serves without a token."""
REFUSAL = json.dumps({"detail": "only /healthz, /readyz and /metrics are served on this "
                      "address; the API listens on loopback"}).encode()


class PublicAddressGate:
    """ASGI middleware: on ``address``, ``PUBLIC_PATHS`` only."""

    def __init__(self, app: ASGIApp, address: str) -> None:
        self.app = app
        self.address = ipaddress.ip_address(address)

    def _public(self, scope: Scope) -> bool:
        server: Any = scope.get("server")
        if not server:
            return False
        try:
            return ipaddress.ip_address(str(server[0]).split("%", 1)[0]) == self.address
        except ValueError:
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._public(scope) or \
                scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(REFUSAL)).encode())]})
        await send({"type": "http.response.body", "body": REFUSAL})
