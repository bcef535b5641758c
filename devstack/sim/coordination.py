"""The simulated engine as a ``worker_client`` user (``--coordinator URL``).

What the engine does with the worker client, the way a real engine would:

1. registers its main process (its tree is the process's descendants) with its URL;
2. tracks every completion with ``client.track``: a drain ends the generation where it waits
   and the stream's last event is the handed-back event (reported to the coordinator in a
   batch, with the tokens produced);
3. stands its child watchdog down in a pre-kill hook, so the coordinator stopping the
   children is not taken for a crash;
4. puts ``install_graceful_shutdown`` in front of its own SIGTERM/SIGINT handlers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from devstack.sim.streams import CompletionStreams, HandedBack, Token
from worker_client import GracefulShutdown, WorkerClient, install_graceful_shutdown

RECORD_DELAY_S = 0.05
"""The end record (a file rewritten whole) is updated this long after the drain notice: at
the notice every engine of the pod wakes at once, and each one's file write would hold a CPU
the engines not yet woken are waiting for."""


class TrackedStreams(CompletionStreams):
    """Completion streams whose every request is tracked by a worker client."""

    def __init__(self, token_interval_s: float, client: WorkerClient,
                 hold_after_tokens: int = 0) -> None:
        super().__init__(token_interval_s, hold_after_tokens)
        self.client = client

    async def generate(
        self, request_id: str, prompt: str, max_tokens: int
    ) -> AsyncIterator[Token | HandedBack]:
        async with self.client.track(request_id) as req:
            async for event in req.stream(super().generate(request_id, prompt, max_tokens)):
                if isinstance(event, HandedBack):  # handed back by the engine's own path
                    req.tokens = event.tokens
                    req.hand_back("engine")
                    yield event
                    return
                yield event
        if req.handed_back:
            handed = HandedBack(request_id, req.tokens)
            self.handed_back.append(handed)
            for listener in self.listeners:
                listener(handed)
            yield handed


def read_token(path: str) -> str | None:
    return Path(path).read_text().strip() or None if path else None


def connect(
    coordinator_url: str,
    token_file: str,
    engine_url: str,
    stand_down_watchdog: Callable[[], Any],
    on_drain: Callable[[dict[str, Any]], None],
) -> tuple[WorkerClient, GracefulShutdown]:
    """Start the worker client on the running loop and chain the signal handlers.

    Call it before the engine adds its own loop signal handlers: they are captured and run
    after the drain.
    """
    client = WorkerClient(
        coordinator_url, token=read_token(token_file), url=engine_url, name="sim-engine"
    )
    client.add_prekill_hook(stand_down_watchdog)

    def drained() -> None:
        times = {
            "drain_received_at_monotonic": client.drain_received_at,
            "shutdown_event_set_at_monotonic": client.shutdown_set_at,
            "shutdown_event_set_at": time.time(),
        }
        asyncio.get_running_loop().call_later(RECORD_DELAY_S, on_drain, times)

    client.on_drain(drained)
    client.start(asyncio.get_running_loop())
    return client, install_graceful_shutdown(client)
