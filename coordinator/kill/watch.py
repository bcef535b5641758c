"""Learn of process exits as events: one event source for any number of processes.

With pidfds, each process's pidfd is registered with an epoll of the watch's own, whose one
descriptor is on the event loop (``loop.add_reader``); a pidfd turns readable the moment its
process exits (as a zombie, before anyone reaps it), which makes that epoll readable, so one
``epoll_wait`` covers hundreds of processes and costs nothing while they live. Each pidfd is
one ``epoll_ctl`` in and one out, not a reader of the loop's own (its handle, its selector
key, its lookups): the kill watches hundreds at once. Without a pidfd (none on this kernel,
or one epoll refuses), ``/proc`` is polled instead: a process has exited once its PID is
gone, a zombie, or another process's (other start ticks).

``ExitEvents`` is that mechanism, and the only one: the kill engine's ``ExitWatcher`` (by
PID, with waits for a set of PIDs, polling every 10 ms) and the service's registry (by worker
id, polling every second) both watch through it. It never opens or closes a pidfd: whoever
opened one closes it, after reading through it how the process exited (``pidfd.exit_code``),
which is why an exit is reported before the descriptor goes. ``settle()`` delivers at once
the exits the loop has not run the callbacks of yet: a caller about to act on "still running"
(the registry before a kill is planned) asks every pidfd itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from coordinator.kill import pidfd, procfs

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.01
"""The kill's fallback polling period (no pidfds): exits are seen within ~10 ms at ~1 /proc
read per process per period."""

K = TypeVar("K", bound=Hashable)


class ExitEvents(Generic[K]):
    """Calls ``on_exit(key)`` when the process watched under ``key`` exits, then forgets it.

    Single event loop (taken at the first watch), no locks. Each watch fires at most once.
    """

    def __init__(self, on_exit: Callable[[K], None], *, poll_interval_s: float) -> None:
        self._on_exit = on_exit
        self._poll_interval_s = poll_interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self.fds: dict[K, int] = {}
        """The pidfd of each process watched through one (owned by the caller)."""
        self._keys: dict[int, K] = {}
        """``fds`` the other way round: what a ready pidfd is the exit of."""
        self._epoll: select.epoll | None = None
        self.polled: dict[K, tuple[int, int]] = {}
        """(PID, start ticks) of each process watched by polling ``/proc``."""
        self._poller: asyncio.Task[None] | None = None

    def watch(self, key: K, pid: int, fd: int | None, start_ticks: int) -> None:
        """Start watching ``pid`` under ``key``: through ``fd`` when given and epoll takes
        it, else by polling for a change of ``/proc/<pid>`` from ``start_ticks``."""
        loop = self._loop = self._loop or asyncio.get_running_loop()
        if fd is not None:
            try:
                self._register(loop, fd)
            except (OSError, ValueError):
                log.exception("cannot watch the pidfd of pid %s: polling it instead", pid)
            else:
                self.fds[key] = fd
                self._keys[fd] = key
                return
        self.polled[key] = (pid, start_ticks)
        if self._poller is None:
            self._poller = loop.create_task(self._poll())

    def _register(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        if self._epoll is None:
            epoll = select.epoll()
            try:
                loop.add_reader(epoll.fileno(), self._ready)
            except BaseException:
                epoll.close()
                raise
            self._epoll = epoll
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except FileExistsError:
            # A number reused by a new pidfd while a duplicate kept the old one's entry.
            self._epoll.modify(fd, select.EPOLLIN)

    def _ready(self) -> None:
        """The epoll is readable: fire every watch whose pidfd is."""
        if self._epoll is None:
            return
        for fd, _ in self._epoll.poll(0):
            key = self._keys.get(fd)
            if key is not None and self.fds.get(key) == fd:
                self._fire(key)

    def unwatch(self, key: K) -> None:
        """Stop watching ``key`` (its pidfd stays open)."""
        fd = self.fds.pop(key, None)
        if fd is not None:
            self._keys.pop(fd, None)
            if self._epoll is not None:
                with contextlib.suppress(OSError, ValueError):  # closed by its owner already
                    self._epoll.unregister(fd)
        self.polled.pop(key, None)

    def settle(self) -> None:
        """Deliver now every exit that has happened but that the loop has not delivered yet
        (a pidfd readable, its callback still queued; or a poll not yet due)."""
        for key, fd in list(self.fds.items()):
            try:
                exited = pidfd.has_exited(fd)
            except OSError:
                continue  # the loop delivers it, as before
            if exited and key in self.fds:
                self._fire(key)
        for key in list(self.polled):
            if key in self.polled and self._has_exited(key):
                self._fire(key)

    def close(self) -> None:
        """Stop watching everything (the pidfds stay open: their owners close them)."""
        for key in list(self.fds):
            self.unwatch(key)
        self.polled.clear()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._epoll is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None

    def _fire(self, key: K) -> None:
        self.unwatch(key)
        self._on_exit(key)

    def _has_exited(self, key: K) -> bool:
        pid, ticks = self.polled[key]
        try:
            stat = procfs.read_stat(pid)
        except OSError:
            return False  # out of file descriptors: look again next period
        return stat is None or stat.zombie or stat.start_ticks != ticks

    async def _poll(self) -> None:
        while True:
            for key in list(self.polled):
                if key in self.polled and self._has_exited(key):
                    self._fire(key)
            await asyncio.sleep(self._poll_interval_s)


@dataclass
class ExitWaiter:
    """Set once every PID it waits for has exited."""

    remaining: set[int]
    event: asyncio.Event = field(default_factory=asyncio.Event)


class ExitWatcher:
    """The kill's watch: calls ``on_exit(pid)`` once for each watched process, when it exits
    (watched again after that, it does not fire again), and waits for sets of PIDs."""

    def __init__(self, on_exit: Callable[[int], None], *, use_pidfd: bool) -> None:
        self._on_exit = on_exit
        self._use_pidfd = use_pidfd
        self._exits: ExitEvents[int] = ExitEvents(self._fire,
                                                  poll_interval_s=POLL_INTERVAL_S)
        self._waiters: list[ExitWaiter] = []
        self._exited: set[int] = set()

    @property
    def _polled(self) -> dict[int, tuple[int, int]]:
        """The PIDs polled for now (the pidfd of each other one is on the loop)."""
        return self._exits.polled

    def watch(self, pid: int, fd: int | None, start_ticks: int) -> None:
        """Start watching ``pid`` (through ``fd`` when pidfds are used)."""
        self._exits.watch(pid, pid, fd if self._use_pidfd else None, start_ticks)

    def _fire(self, pid: int) -> None:
        if pid in self._exited:
            return
        self._exited.add(pid)
        self._on_exit(pid)
        for waiter in self._waiters:
            waiter.remaining.discard(pid)
            if not waiter.remaining:
                waiter.event.set()

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
        self._exits.close()
