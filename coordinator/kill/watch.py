"""Learn of process exits as events: one event source for any number of processes.

With pidfds, each process's pidfd is registered with the event loop's selector (epoll on
Linux) through ``loop.add_reader``; the pidfd turns readable the moment the process exits (as
a zombie, before anyone reaps it), so one ``epoll_wait`` covers hundreds of processes and costs
nothing while they live. Without pidfds, ``/proc`` is polled instead, and the report says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.kill import procfs

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.01
"""Fallback polling period (no pidfds): exits are seen within ~10 ms at ~1 /proc read per
process per period."""


@dataclass
class ExitWaiter:
    """Set once every PID it waits for has exited."""

    remaining: set[int]
    event: asyncio.Event = field(default_factory=asyncio.Event)


class ExitWatcher:
    """Calls ``on_exit(pid)`` once for each watched process, when it exits."""

    def __init__(self, on_exit: Callable[[int], None], *, use_pidfd: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_exit = on_exit
        self._use_pidfd = use_pidfd
        self._fds: dict[int, int] = {}
        self._polled: dict[int, int] = {}
        self._poller: asyncio.Task[None] | None = None
        self._waiters: list[ExitWaiter] = []
        self._exited: set[int] = set()

    def watch(self, pid: int, fd: int | None, start_ticks: int) -> None:
        """Start watching ``pid`` (through ``fd`` when pidfds are used)."""
        if self._use_pidfd and fd is not None:
            try:
                self._loop.add_reader(fd, self._fire, pid)
            except (OSError, ValueError):
                log.exception("cannot watch the pidfd of pid %s: polling it instead", pid)
            else:
                self._fds[pid] = fd
                return
        self._polled[pid] = start_ticks
        if self._poller is None:
            self._poller = self._loop.create_task(self._poll())

    def _fire(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            self._loop.remove_reader(fd)
        self._polled.pop(pid, None)
        if pid in self._exited:
            return
        self._exited.add(pid)
        self._on_exit(pid)
        for waiter in self._waiters:
            waiter.remaining.discard(pid)
            if not waiter.remaining:
                waiter.event.set()

    async def _poll(self) -> None:
        while True:
            for pid, ticks in list(self._polled.items()):
                try:
                    stat = procfs.read_stat(pid)
                except OSError:
                    continue  # out of file descriptors: look again next period
                if stat is None or stat.zombie or stat.start_ticks != ticks:
                    self._fire(pid)
            await asyncio.sleep(POLL_INTERVAL_S)

    async def wait(self, pids: set[int], timeout_s: float) -> bool:
        """Wait until every PID in ``pids`` has exited, at most ``timeout_s``; True if all did."""
        waiter = ExitWaiter(remaining={p for p in pids if p not in self._exited})
        if not waiter.remaining:
            return True
        if timeout_s <= 0:
            return False
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.event.wait()
        except TimeoutError:
            return False
        finally:
            self._waiters.remove(waiter)
        return True

    def close(self) -> None:
        """Stop watching everything (the pidfds stay open: their owner closes them)."""
        for fd in self._fds.values():
            self._loop.remove_reader(fd)
        self._fds.clear()
        self._polled.clear()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
