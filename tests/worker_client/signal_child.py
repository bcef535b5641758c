"""An engine-like process for the signal-chaining tests (run as a script, not collected).

    python signal_child.py asyncio|asyncio-held|sync [COORDINATOR_URL]

Prints one line per thing that happened, in order, and exits 0 after its own shutdown.
``asyncio-held`` is ``asyncio`` where a thread other than the loop's that hands the engine's
loop handler to the loop is held right there until the engine closed its client: the loop runs
the handler, the engine exits, and only then does that thread go on, the way the scheduler may
order them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

from worker_client import WorkerClient, install_graceful_shutdown


def say(line: str) -> None:
    # One write(2) per line: a signal handler that says something cannot split another line.
    os.write(1, (line + "\n").encode())


HOLD_BOUND_S = 20.0
"""Bound on the hold of ``asyncio-held`` (it ends when the engine closed its client)."""


def previous_handler(signum: int, frame: FrameType | None) -> None:
    say(f"previous-handler {signal.Signals(signum).name}")


def hold_handover(
    loop: asyncio.AbstractEventLoop, handler: Callable[..., object], closed: threading.Event
) -> None:
    """Hold a thread other than the loop's right after it handed ``handler`` to the loop, until
    ``closed``: what it does next comes after the loop ran the handler and the engine exited."""
    original = loop.call_soon_threadsafe

    def call_soon_threadsafe(
        callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        handle = original(callback, *args, context=context)
        if callback is handler and threading.current_thread() is not threading.main_thread():
            say("handover-held")
            closed.wait(HOLD_BOUND_S)
        return handle

    setattr(loop, "call_soon_threadsafe", call_soon_threadsafe)  # noqa: B010


async def asyncio_engine(coordinator: str | None, held: bool = False) -> None:
    stop = asyncio.Event()
    # The engine's own handler installed before ours: it is chained after the drain.
    signal.signal(signal.SIGTERM, previous_handler)
    client = WorkerClient(coordinator, url="http://127.0.0.1:1").start()
    install_graceful_shutdown(client)
    loop = asyncio.get_running_loop()

    def engine_loop_handler(name: str) -> None:
        say(f"loop-handler {name}")
        stop.set()

    # Registered after ours, the way SGLang's tokenizer manager does: captured, run after.
    loop.add_signal_handler(signal.SIGTERM, engine_loop_handler, "SIGTERM")
    closed = threading.Event()
    if held:
        hold_handover(loop, engine_loop_handler, closed)

    entered = asyncio.Event()

    async def request() -> None:
        never = asyncio.Event()

        async def generation() -> AsyncIterator[str]:
            yield "t0"
            await never.wait()
            yield "t1"

        async with client.track("child-1") as req:
            entered.set()
            async for _ in req.stream(generation()):
                pass
            # Said inside the block: the signal is released as soon as the request left it,
            # and the engine's handlers could otherwise say their lines first.
            say(f"handed-back {req.handed_back} {req.tokens}")

    task = asyncio.create_task(request())
    await entered.wait()
    await asyncio.sleep(0)  # let the request reach its generation's wait
    say("ready")
    try:
        await stop.wait()
    finally:
        await task
        say("engine-cleanup")
        client.close()
        closed.set()


def sync_engine(coordinator: str | None) -> None:
    client = WorkerClient(coordinator).start()
    install_graceful_shutdown(client)
    try:
        with client.track("sync-1") as req:
            say("ready")
            while not req.shutting_down:
                time.sleep(0.001)
            req.hand_back()
            # Said inside the block: the signal is released as soon as the request left it,
            # and the engine's handlers could otherwise say their lines first.
            say(f"handed-back {req.handed_back} {req.tokens}")
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        say("keyboard-interrupt")
    say("engine-cleanup")
    client.close()


def main() -> int:
    # Python leaves SIGINT ignored when it started ignored (a job a non-interactive shell put
    # in the background inherits SIG_IGN): an engine started from a terminal, as these tests
    # mean, has Python's own KeyboardInterrupt handler, whatever launched the test run.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    mode = sys.argv[1]
    coordinator = sys.argv[2] if len(sys.argv) > 2 else None
    if mode in ("asyncio", "asyncio-held"):
        try:
            asyncio.run(asyncio_engine(coordinator, held=mode == "asyncio-held"))
        except KeyboardInterrupt:
            say("keyboard-interrupt")
    else:
        sync_engine(coordinator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
