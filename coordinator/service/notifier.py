"""Push of drain events to the workers' held-open NDJSON streams.

The push path is kept short because the drain's first milliseconds matter: an event is
serialized once, put into each open stream's queue without awaiting anything, and each stream
writes it in the next loop iteration. Nothing here polls; pings come from one timer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

_CLOSE: bytes = b""


def event_line(event: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class Subscription:
    """One open stream: a queue of lines to write."""

    __slots__ = ("queue", "worker_id")

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def lines(self) -> AsyncIterator[bytes]:
        """The lines to write, until the stream is closed."""
        while True:
            line = await self.queue.get()
            if line is _CLOSE:
                return
            yield line

    def close(self) -> None:
        """End this stream after the lines already queued."""
        self.queue.put_nowait(_CLOSE)


class Notifier:
    """Open event streams by worker id, and the ping timer."""

    def __init__(self, ping_interval_s: float) -> None:
        self.ping_interval_s = ping_interval_s
        self._subs: dict[str, set[Subscription]] = {}
        self._ping: asyncio.TimerHandle | None = None

    def subscribe(self, worker_id: str) -> Subscription:
        sub = Subscription(worker_id)
        self._subs.setdefault(worker_id, set()).add(sub)
        if self._ping is None:
            self._arm_ping()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.worker_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.worker_id]

    def connected(self, worker_id: str) -> int:
        return len(self._subs.get(worker_id, ()))

    def publish(self, event: dict[str, Any], worker_ids: list[str] | None = None) -> int:
        """Queue ``event`` on every open stream (or those of ``worker_ids``); returns how many."""
        line = event_line(event)
        count = 0
        targets = self._subs if worker_ids is None else {
            w: self._subs[w] for w in worker_ids if w in self._subs}
        for subs in targets.values():
            for sub in subs:
                sub.queue.put_nowait(line)
                count += 1
        return count

    def close_worker(self, worker_id: str) -> None:
        """End the streams of one worker (deregistered)."""
        for sub in self._subs.pop(worker_id, set()):
            sub.close()

    def close_all(self) -> None:
        """End every stream (the coordinator is stopping)."""
        for worker_id in list(self._subs):
            self.close_worker(worker_id)
        if self._ping is not None:
            self._ping.cancel()
            self._ping = None

    def _arm_ping(self) -> None:
        loop = asyncio.get_running_loop()
        self._ping = loop.call_later(self.ping_interval_s, self._send_ping)

    def _send_ping(self) -> None:
        self._ping = None
        if self._subs:
            self.publish({"type": "ping", "at": time.time()})
            self._arm_ping()
