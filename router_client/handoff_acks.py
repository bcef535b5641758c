"""Acknowledge handed-back requests to coordinators the continuation layer knows only by URL.

A layer in front of a router does not know which pod served a stream: the handed-back event
names the request, not the worker. So every coordinator is watched (``Watcher``, one
long-poll each, ``?view=router``), and a handoff is acknowledged to the coordinator that
lists it, as soon as one does (its worker's batched report usually lands within a few
milliseconds of the event). One that none lists within ``FIND_WITHIN_S`` (its report was
lost, or its coordinator is not in the list) is acknowledged to all of them: each remembers
it as an early acknowledgement and applies it if the handoff is ever reported.

The continuation never waits for any of this: each acknowledgement runs in a task of its
own.

Streams a drain ended through a stock engine's own API (``--end-streams``) name no pod
either: such a coordinator shows its ending window open in ``/status`` (``stream_ending``)
while it takes ``continued`` acknowledgements. A stream that ended early while exactly one
watched coordinator shows its window open (or opens it within ``FIND_WITHIN_S``) was that
drain's, and once its continuation was taken upstream it is acknowledged there as
continued (``continued_later``). With two windows open at once it cannot be told whose it
was, and it is acknowledged to neither: both drains count it cut, never one that was not
theirs as handed over (``ambiguous``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence

from router_client.watch import Watcher

log = logging.getLogger("router_client.continuation")

FIND_WITHIN_S = 2.0
"""How long a handoff may take to be listed by its coordinator before it is acknowledged to
every coordinator (s): far above a report's coalescing window and round trip, far below any
drain's migration budget."""


DISCOVERED_CONNECTIONS = 1024
"""Connections to discovered coordinators at most (a long-poll and an ack call each): a
fleet of a few hundred pods."""


class HandoffAcks:
    """Acknowledges handoffs to ``coordinators`` in the background (nothing without any)."""

    def __init__(self, coordinators: Sequence[str], *, token: str | None = None,
                 find_within_s: float = FIND_WITHIN_S,
                 on_taken: Callable[[int], None] | None = None,
                 on_continued: Callable[[int, int], None] | None = None) -> None:
        urls = [c.rstrip("/") for c in coordinators]
        # The Watcher maps worker URLs to coordinators; here each coordinator stands for
        # the workers nobody named, and acks go by request id alone.
        self._watcher = Watcher({u: u for u in urls}, token=token) if urls else None
        self._named = frozenset(urls)
        self._token = token
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.find_within_s = find_within_s
        self.on_taken = on_taken
        """Told how many handoffs a coordinator took (``acked`` or ``early``) after each
        acknowledgement."""
        self.on_continued = on_continued
        """Told (counted as taken over, not acknowledged for ambiguity) after each stream
        that ended early was taken over while a drain's ending window was open."""

    def start(self) -> None:
        """Start watching (inside the running loop; again is a no-op)."""
        if self._watcher is not None and not self._started:
            self._started = True
            self._watcher.start()

    async def discovered(self, coordinators: Iterable[str]) -> None:
        """Watch these coordinators besides the ones named at the start, and no longer the
        ones a discovery found before but not now (their pods are gone): a headless
        Service's addresses, say, as pods come and go."""
        found = {c.rstrip("/") for c in coordinators}
        if self._watcher is None:
            if not found:
                return
            self._watcher = Watcher({}, token=self._token,
                                    max_connections=DISCOVERED_CONNECTIONS)
        self.start()  # following them from now on: a handoff is found as it is listed
        for url in sorted(found - set(self._watcher.views)):
            self._watcher.follow(url)
        for url in set(self._watcher.views) - found - self._named:
            await self._watcher.forget(url)

    def followed(self) -> set[str]:
        """The coordinators watched now."""
        return set() if self._watcher is None else set(self._watcher.views)

    def ack_later(self, request_id: str) -> None:
        """Acknowledge ``request_id`` in the background."""
        if self._watcher is None:
            return
        self.start()
        task = asyncio.get_running_loop().create_task(self._ack(self._watcher, request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def watching(self) -> bool:
        """Coordinators are watched (named, or discovered)."""
        return self._watcher is not None

    async def endings_open(self) -> list[str]:
        """The coordinators whose ending window is open, waiting up to ``find_within_s`` for
        one to show it (a stream's end may reach the proxy before its long-poll answer);
        none at once without coordinators."""
        watcher = self._watcher
        if watcher is None:
            return []
        self.start()
        await watcher.wait_for(lambda: bool(watcher.open_endings()), self.find_within_s)
        return watcher.open_endings()

    def continued_later(self, request_id: str) -> None:
        """A stream that ended early was taken over: acknowledge it as continued to the
        drain that ended it, if one watched coordinator alone has its window open."""
        if self._watcher is None:
            return
        task = asyncio.get_running_loop().create_task(self._continued(self._watcher,
                                                                       request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _continued(self, watcher: Watcher, request_id: str) -> None:
        endings = await self.endings_open()
        if len(endings) != 1:
            if endings:
                log.warning("stream %s ended while %d drains ended streams (%s): not "
                            "acknowledged, each counts it cut", request_id, len(endings),
                            ", ".join(endings))
                if self.on_continued is not None:
                    self.on_continued(0, 1)
            return
        taken = await watcher.ack_continued(endings[0], [request_id])
        if self.on_continued is not None:
            self.on_continued(len(taken), 0)

    def listing(self, request_id: str) -> str | None:
        """The coordinator that lists ``request_id`` as pending, if any."""
        if self._watcher is None:
            return None
        for url, view in self._watcher.views.items():
            if view.status is not None and view.status.migration(request_id) is not None:
                return url
        return None

    async def _ack(self, watcher: Watcher, request_id: str) -> None:
        """1. Wait (up to ``find_within_s``) for a coordinator to list the handoff.
        2. Acknowledge it there, or to every coordinator when none does."""
        await watcher.wait_for(lambda: self.listing(request_id) is not None,
                               self.find_within_s)
        target = self.listing(request_id)
        try:
            taken = await watcher.ack([request_id], target)
        except Exception as exc:  # a background task: log, never crash the loop
            log.warning("acknowledging %s failed: %s", request_id, exc)
            return
        if taken and self.on_taken is not None:
            self.on_taken(len(taken))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watcher is not None:
            await self._watcher.close()
