"""A wake-everyone signal: long-polls and the drain controller wait on the next change.

``notify()`` resolves every waiting future directly (no task per waiter, no polling), so a
waiter runs in the very next loop iteration after the change.
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """Waiters block until the next ``notify()`` or their timeout."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[bool]] = set()

    def notify(self) -> None:
        """Wake every current waiter."""
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(True)

    async def wait(self, timeout_s: float) -> bool:
        """Wait for the next change; True if it came, False on timeout."""
        if timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.add(fut)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            self._waiters.discard(fut)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
