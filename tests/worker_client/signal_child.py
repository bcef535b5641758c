"""An engine-like process for the signal-chaining tests (run as a script, not collected).

    python signal_child.py asyncio|sync [COORDINATOR_URL]

Prints one line per thing that happened, in order, and exits 0 after its own shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from types import FrameType

from worker_client import WorkerClient, install_graceful_shutdown


def say(line: str) -> None:
    # One write(2) per line: a signal handler that says something cannot split another line.
    os.write(1, (line + "\n").encode())


def previous_handler(signum: int, frame: FrameType | None) -> None:
    say(f"previous-handler {signal.Signals(signum).name}")


async def asyncio_engine(coordinator: str | None) -> None:
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


def sync_engine(coordinator: str | None) -> None:
    client = WorkerClient(coordinator).start()
    install_graceful_shutdown(client)
    try:
        with client.track("sync-1") as req:
            say("ready")
            while not req.shutting_down:
                time.sleep(0.001)
            req.hand_back()
        say(f"handed-back {req.handed_back} {req.tokens}")
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        say("keyboard-interrupt")
    say("engine-cleanup")
    client.close()


def main() -> int:
    mode = sys.argv[1]
    coordinator = sys.argv[2] if len(sys.argv) > 2 else None
    if mode == "asyncio":
        try:
            asyncio.run(asyncio_engine(coordinator))
        except KeyboardInterrupt:
            say("keyboard-interrupt")
    else:
        sync_engine(coordinator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
