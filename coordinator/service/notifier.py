"""Push of drain events to the workers' held-open NDJSON streams.

The push path is kept short because the drain's first milliseconds matter: an event is
serialized once and written to each open stream right away, inside ``publish``, when the
stream is idle: its ASGI ``send`` is stepped by hand, and it returns without suspending unless
the transport is paused for flow control. Otherwise (paused, or a line still queued ahead) the
line goes into the stream's queue and the stream's own task writes it. Waiting for the stream
tasks' turn on the loop instead put the rest of the drain request (its answer, middleware,
other ready callbacks) and the loop's scheduling ahead of every worker's notice: p50 1.4 ms,
p99 10 ms between the drain's start and the last line written, with 16 streams. Nothing here
polls; pings come from one timer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import shutdown_wire as wire

_CLOSE: bytes = b""


def event_line(event: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class Subscription:
    """One open stream: a queue of lines to write."""

    __slots__ = ("idle", "queue", "worker_id", "write_now")

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.write_now: Callable[[bytes], Awaitable[None]] | None = None
        """The stream's ``send`` of one body line, set once its head is sent."""
        self.idle = False
        """True while the stream's task waits for a line (nothing queued, no send running)."""

    async def lines(self) -> AsyncIterator[bytes]:
        """The lines to write, until the stream is closed."""
        while True:
            self.idle = True
            try:
                line = await self.queue.get()
            finally:
                self.idle = False
            if line is _CLOSE:
                return
            yield line

    def put(self, line: bytes) -> None:
        """Write ``line`` now if the stream is idle and its transport takes it; else queue it."""
        if self.idle and self.queue.empty() and self.write_now is not None:
            step = self.write_now(line)
            try:
                step.send(None)  # type: ignore[attr-defined]
            except StopIteration:
                return
            except Exception:  # the connection is gone: the stream's task will find out
                return
            step.close()  # type: ignore[attr-defined]  # it would wait: nothing written yet
        self.queue.put_nowait(line)

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
                sub.put(line)
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
            self.publish({"type": wire.EVENT_PING, "at": time.time()})
            self._arm_ping()
