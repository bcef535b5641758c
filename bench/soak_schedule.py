"""The chaos soak's order of drains (``bench/soak.py``): which kind comes next, and which
pods may drain at once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import AsyncIterator

from bench.soak_kinds import Kind


class Schedule:
    """The seeded sequence of kinds: rounds over every kind, each shuffled."""

    def __init__(self, kinds: list[Kind], rng: random.Random, total: int,
                 deadline: float, restart_pod: int) -> None:
        self.kinds = kinds
        self.rng = rng
        self.total = total
        self.deadline = deadline
        self.restart_pod = restart_pod
        self.queue: deque[Kind] = deque()
        self.reserved = 0

    def _round(self) -> None:
        order = list(self.kinds)
        self.rng.shuffle(order)
        self.queue.extend(order)

    def reserve(self, pod: int) -> Kind | None:
        """The next kind this pod may run, or None when the run has all it asked for."""
        if self.reserved >= self.total or time.monotonic() >= self.deadline:
            return None
        while True:
            # The restart pod takes the kinds only it may run first, so none piles up.
            mine = [k for k in self.queue if k.restart_pod_only and pod == self.restart_pod]
            anyone = [k for k in self.queue if not k.restart_pod_only]
            for kind in (*mine, *anyone):
                self.queue.remove(kind)
                self.reserved += 1
                return kind
            self._round()


class Slots:
    """Up to ``parallel`` shared drains at once, or one exclusive drain alone, granted in
    the order asked for (a pod that just finished a drain queues behind those waiting)."""

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel
        self.shared = 0
        self.exclusive = False
        self.queue: deque[tuple[asyncio.Future[None], bool]] = deque()

    def _grant(self) -> None:
        while self.queue:
            waiter, exclusive = self.queue[0]
            if waiter.done():  # cancelled while waiting
                self.queue.popleft()
                continue
            free = not self.exclusive and (not self.shared if exclusive
                                           else self.shared < self.parallel)
            if not free:
                return
            self.queue.popleft()
            self.exclusive = self.exclusive or exclusive
            self.shared += not exclusive
            waiter.set_result(None)

    def _release(self, exclusive: bool) -> None:
        if exclusive:
            self.exclusive = False
        else:
            self.shared -= 1
        self._grant()

    @contextlib.asynccontextmanager
    async def hold(self, exclusive: bool) -> AsyncIterator[None]:
        waiter = asyncio.get_running_loop().create_future()
        self.queue.append((waiter, exclusive))
        self._grant()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled
                self._release(exclusive)
            raise
        try:
            yield
        finally:
            self._release(exclusive)
