"""``GET /workers/{id}/events``: the held-open NDJSON stream a worker learns of a drain from.

Written as a bare ASGI response so the path from ``Notifier.publish`` to the socket is one
queue hand-off and one ``send``: no middleware, no per-line wrapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

import shutdown_wire as wire
from coordinator.service.notifier import Subscription, event_line
from coordinator.service.registry import Worker
from coordinator.service.runtime import Coordinator

MEDIA_TYPE = "application/x-ndjson"

DRAIN_LINE = b'{"type":"%s"' % wire.EVENT_DRAIN.encode()
"""How a ``drain`` line starts (``event_line`` of the coordinator's drain event)."""


class EventStream(Response):
    """Streams one worker's events until it disconnects, is deregistered, or we stop."""

    media_type = MEDIA_TYPE

    def __init__(self, coordinator: Coordinator, worker: Worker) -> None:
        super().__init__(media_type=MEDIA_TYPE)
        self.coordinator = coordinator
        self.worker = worker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        coordinator = self.coordinator
        worker = self.worker
        sub = coordinator.notifier.subscribe(worker.id)
        coordinator.stream_opened(worker)
        watcher = asyncio.get_running_loop().create_task(self._until_disconnect(receive, sub))
        try:
            await send({
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", MEDIA_TYPE.encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-accel-buffering", b"no"),
                ],
            })
            hello: dict[str, Any] = {
                "type": wire.EVENT_HELLO, "id": worker.id, "phase": coordinator.machine.phase.value,
                "generation": coordinator.machine.generation, "at": time.time(),
            }
            bell = coordinator.doorbell
            if bell is not None and bell.info is not None:
                hello["doorbell"] = bell.info.as_json()
            first = event_line(hello) + b"".join(
                event_line(e) for e in coordinator.fleet.catch_up_events())
            await send({"type": "http.response.body", "body": first, "more_body": True})

            def write_now(line: bytes) -> Awaitable[None]:
                if line.startswith(DRAIN_LINE):
                    worker.pushed_at = time.time()
                return send({"type": "http.response.body", "body": line, "more_body": True})

            sub.write_now = write_now
            async for line in sub.lines():
                await send({"type": "http.response.body", "body": line, "more_body": True})
                if line.startswith(DRAIN_LINE):
                    worker.pushed_at = time.time()
            with contextlib.suppress(OSError, RuntimeError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            coordinator.notifier.unsubscribe(sub)
            coordinator.stream_closed(worker)

    @staticmethod
    async def _until_disconnect(receive: Receive, sub: Subscription) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                sub.close()
                return
