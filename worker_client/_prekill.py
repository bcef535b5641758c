"""Pre-kill hooks: what the engine does when the ordered kill is about to start.

The coordinator's ``terminate`` event runs every hook (a plain function in a thread of its
own, a coroutine function on the engine's loop) and then reports ``prekill_done``, whatever
the hooks did: a hook that fails or hangs must not hold the kill, whose deadline is fixed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from worker_client._loop import LoopBridge

log = logging.getLogger("worker_client")

PrekillHook = Callable[[], Any]
"""A plain function or a coroutine function (run on the engine's loop)."""

PREKILL_HOOK_TIMEOUT_S = 5.0
"""How long one coroutine hook may take before the next runs and ``prekill_done`` is
reported anyway."""


class PrekillHooks:
    def __init__(self, bridge: LoopBridge, done: Callable[[], None]) -> None:
        self._bridge = bridge
        self._done = done
        self._hooks: list[PrekillHook] = []

    def add(self, hook: PrekillHook) -> None:
        self._hooks.append(hook)

    def start(self) -> None:
        """Run the hooks in a thread of their own (the event reader goes on reading)."""
        threading.Thread(target=self._run, name="worker-client-prekill", daemon=True).start()

    def _run(self) -> None:
        for hook in self._hooks:
            try:
                loop = self._bridge.loop
                if inspect.iscoroutinefunction(hook):
                    if loop is None or loop.is_closed():
                        asyncio.run(hook())
                    else:
                        asyncio.run_coroutine_threadsafe(hook(), loop).result(
                            PREKILL_HOOK_TIMEOUT_S)
                else:
                    hook()
            except Exception:
                log.exception("pre-kill hook %r failed", hook)
        self._done()
