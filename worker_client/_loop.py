"""The engine's asyncio loop, seen from the client's threads.

The drain notice may be read on the loop itself (the loop reader, the doorbell) or in one of
the client's threads; ``shutdown_event`` is an asyncio event and must be set on the loop.
Everything that must run on the loop goes through ``LoopBridge.call``: at once when already
on it (the drain is acted on in the very iteration that read it), queued otherwise, and run
in place when there is no loop to queue it on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LoopBridge:
    """The loop the client is bound to (None until ``start`` or ``attach_loop``)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def here(self) -> bool:
        """Whether the caller runs on the bound loop."""
        return self.loop is not None and running_loop() is self.loop

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop: now when on it, queued when it is open (running or not
        yet), now in this thread when there is none or it closed."""
        loop = self.loop
        if loop is None or loop.is_closed() or running_loop() is loop:
            fn()
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop closed in between
            fn()

    def call_if_running(self, fn: Callable[[], None]) -> None:
        """Like ``call``, but only a running loop gets it queued (closing: a loop that
        stopped will not run it, so it is done now)."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running() or running_loop() is loop:
            fn()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(fn)
