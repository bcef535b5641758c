"""Serve a small test upstream on a free loopback port and say where in a ready file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable

import uvicorn
from starlette.applications import Starlette


def run(app: Starlette, ready_file: str,
        on_close: Callable[[], Awaitable[None]] | None = None) -> None:
    """1. Bind a free loopback port and listen.
    2. Write ``{"pid", "port", "url"}`` to ``ready_file`` (atomically).
    3. Serve until SIGTERM (uvicorn re-raises it: the process ends by that signal)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    port = sock.getsockname()[1]
    with open(f"{ready_file}.tmp", "w") as f:
        json.dump({"pid": os.getpid(), "port": port, "url": f"http://127.0.0.1:{port}"}, f)
    os.replace(f"{ready_file}.tmp", ready_file)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            if on_close is not None:
                await on_close()

    asyncio.run(serve())
