"""Put the drain in front of the engine's own SIGTERM/SIGINT handling.

What happens to a SIGTERM or SIGINT once ``install_graceful_shutdown`` ran:

1. Our handler only records the signal and wakes a helper thread (signal handlers only record).
2. The helper starts the drain here (``shutdown_event`` is set, every tracked request is handed
   back) and asks the coordinator to drain the whole pod (``POST /drain``, ``wait=false``).
3. It waits until no request is in flight and every handoff was reported, bounded by the
   drain's migration deadline.
4. It releases the signal to the engine. The handler that was installed before ours runs
   first, by raising the signal again to the main thread; only once it returned are the
   handlers the engine registered later through ``loop.add_signal_handler`` (captured, never
   installed) handed to the loop. Those are what usually makes the engine exit and close its
   client, which ignores the released signal from then on (``settle``): handed over first, they
   could get there before the raised signal was handled, and the previous handler would never
   run. SIGINT's default handler raises KeyboardInterrupt, which is why it runs after our part,
   never before. A SIG_DFL signal with no engine handler ends the process the default way.

Each delivered signal is handled once. The same signal arriving again while the drain waits
releases it at once (a second Ctrl-C forces, as in uvicorn). After the release, signals go
straight to the engine's handlers (the previous one, then the captured ones); once the engine
closes its client (it is exiting), further deliveries of a released signal are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from worker_client._client import WorkerClient

log = logging.getLogger("worker_client")

DEFAULT_DRAIN_WAIT_S = 30.0
"""Longest wait for in-flight requests when the drain names no migration deadline (s)."""

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
LoopCallback = tuple[Callable[..., object], tuple[Any, ...]]


class GracefulShutdown:
    """The installed chain; ``uninstall()`` puts the previous handlers back."""

    def __init__(
        self,
        client: WorkerClient,
        loop: asyncio.AbstractEventLoop | None,
        signals: Sequence[int],
        drain_wait_s: float,
    ) -> None:
        self.client = client
        self.loop = loop
        self.signals = tuple(signals)
        self.drain_wait_s = drain_wait_s
        self.previous: dict[int, Handler] = {}
        self.captured: dict[int, list[LoopCallback]] = {s: [] for s in self.signals}
        """Engine handlers registered through ``loop.add_signal_handler`` after us."""
        self.released: set[int] = set()
        self.received: list[int] = []
        """Every signal our handler saw, in order."""
        self._started: set[int] = set()
        self._reraised: dict[int, bool] = {}
        """Released signals raised again for the previous handler, not handled yet."""
        self._lock = threading.Lock()
        self._escalate = threading.Event()
        self._patched_loop: Any = None

    # -- installation -----------------------------------------------------------------------

    def install(self) -> GracefulShutdown:
        for signum in self.signals:
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        if self.loop is not None:
            self._patch_loop(self.loop)
        return self

    def settle(self) -> None:
        """The engine is exiting: ignore further deliveries of the signals already released.

        Python puts SIG_DFL back while the interpreter finalizes, so a late SIGTERM (the
        coordinator's kill reaching the root as it exits on its own) would turn a clean exit 0
        into death by signal. SIG_IGN survives finalization.
        """
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may change dispositions
        for signum in tuple(self.released):
            signal.signal(signum, signal.SIG_IGN)
            if self._reraised.pop(signum, False):
                # Raised again for the previous handler but not handled yet (the engine closed
                # its client on its own in between): that delivery is ignored from now on, so
                # the engine's handlers get their turn here.
                self._hand_over(signum, None, first=True)

    def uninstall(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if self._patched_loop is not None:
            for name in ("add_signal_handler", "remove_signal_handler"):
                with contextlib.suppress(AttributeError):
                    delattr(self._patched_loop, name)
            self._patched_loop = None

    def _patch_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        original_add = loop.add_signal_handler
        original_remove = loop.remove_signal_handler

        def add_signal_handler(sig: int, callback: Callable[..., object], *args: Any) -> None:
            if sig in self.captured:
                self.captured[sig].append((callback, args))
            else:
                original_add(sig, callback, *args)

        def remove_signal_handler(sig: int) -> bool:
            if sig in self.captured:
                found = bool(self.captured[sig])
                self.captured[sig].clear()
                return found
            return original_remove(sig)

        try:
            # Instance attributes shadow the loop's methods for this loop only.
            setattr(loop, "add_signal_handler", add_signal_handler)  # noqa: B010
            setattr(loop, "remove_signal_handler", remove_signal_handler)  # noqa: B010
            self._patched_loop = loop
        except (AttributeError, TypeError):
            log.warning("cannot capture signal handlers of %r (no instance attributes)", loop)

    # -- the signal -------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if signum in self.released:
            # Our own re-raise (the release) or a later delivery: the engine's handlers.
            self._hand_over(signum, frame, first=self._reraised.pop(signum, False))
            return
        with self._lock:
            first = signum not in self._started
            self._started.add(signum)
        if first:
            threading.Thread(
                target=self._drain_then_release, args=(signum,), name="worker-client-signal",
                daemon=True,
            ).start()
        else:
            self._escalate.set()

    def _drain_then_release(self, signum: int) -> None:
        name = signal.Signals(signum).name
        # 1. Start (or join) the drain, here and through the coordinator.
        self.client.start_local_drain(f"{name} to engine pid {os.getpid()}")
        # 2. Wait for the requests to be handed back and reported.
        deadline = time.monotonic() + self._wait_budget()
        while self.client.inflight > 0 and not self._escalate.is_set():
            if time.monotonic() > deadline:
                log.warning("releasing %s with %d requests in flight", name, self.client.inflight)
                break
            self._escalate.wait(0.005)
        if self.client.registered.is_set():
            self.client.wait_drained(max(0.0, deadline - time.monotonic()))
        # 3. Release the signal to the engine's own handlers.
        self.release(signum)

    def release(self, signum: int) -> None:
        """Hand ``signum`` to the engine's handlers (the previous one, then the captured ones).

        A callable previous handler is reached by raising the signal again to the main thread;
        the captured handlers are handed to the loop from there, after it returned
        (``_hand_over``), never from here: the loop could run them, and the engine exit and
        ignore the signal (``settle``), before the main thread handled the raised signal.
        """
        previous = self.previous.get(signum)
        with self._lock:
            if signum in self.released:
                return
            if callable(previous):
                self._reraised[signum] = True  # before ``released``: settle() looks at both
            self.released.add(signum)
        if callable(previous):
            signal.pthread_kill(threading.main_thread().ident or 0, signum)
            self._wake_loop()
        elif self.captured.get(signum):
            self._run_captured(signum, first=True)
        elif previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _wake_loop(self) -> None:
        """Make the loop's select() return, so that the main thread handles the raised signal.

        The main thread may have checked for signals last just before it blocked in select():
        Python runs a handler only once that returns, and nothing else would wake it (asyncio's
        wake-up fd comes with ``loop.add_signal_handler``, which we capture). The signal is
        already pending for the main thread then, so its handler runs as soon as it wakes.
        """
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(_wake_up)

    def _hand_over(self, signum: int, frame: FrameType | None, *, first: bool) -> None:
        """On the main thread: the previous handler, then the captured ones on the loop."""
        previous = self.previous.get(signum)
        try:
            if callable(previous):
                previous(signum, frame)
        finally:  # also when it raised (SIGINT's KeyboardInterrupt)
            self._run_captured(signum, first=first)

    def _run_captured(self, signum: int, *, first: bool) -> None:
        """Queue the captured handlers on the loop; without a loop, run the release's here."""
        loop = self.loop
        for callback, args in list(self.captured.get(signum, ())):
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(callback, *args)
                    continue
                except RuntimeError:  # the loop closed in between
                    pass
            if first:
                callback(*args)

    def _wait_budget(self) -> float:
        drain = self.client.drain or {}
        deadline_at = drain.get("migration_deadline_at") or drain.get("deadline_at")
        if isinstance(deadline_at, int | float):
            return max(0.0, float(deadline_at) - time.time())
        return self.drain_wait_s


def _wake_up() -> None:
    """Nothing to do: queued only to wake the loop up."""


def install_graceful_shutdown(
    client: WorkerClient,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    drain_wait_s: float = DEFAULT_DRAIN_WAIT_S,
) -> GracefulShutdown:
    """Chain SIGTERM/SIGINT so the drain runs before the engine's own handlers.

    Call it from the main thread, after the engine installed its own ``signal.signal``
    handlers (they become the previous handlers, run after the drain). Handlers the engine
    adds later through ``loop.add_signal_handler`` on ``loop`` (the running loop by default)
    are captured and run after the drain too.
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    if loop is not None and client.loop is None:
        client.attach_loop(loop)
    graceful = GracefulShutdown(client, loop, signals, drain_wait_s).install()
    client.on_close(graceful.settle)
    return graceful
