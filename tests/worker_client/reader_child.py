"""An asyncio engine that only waits for a drain (run as a script, not collected).

    python reader_child.py COORDINATOR_URL loop|thread

Prints ``registered`` once its event stream is open, then, at the drain, one line
``drain read-in=<thread> set-on-loop=<bool>``, and waits for the coordinator's kill.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from worker_client import WorkerClient


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def engine(coordinator: str, reader: str) -> None:
    client = WorkerClient(coordinator, event_reader=reader).start()
    loop_thread = threading.current_thread().name
    set_in: list[str] = []
    client.on_drain(lambda: set_in.append(threading.current_thread().name))
    await asyncio.to_thread(client.registered.wait, 60)
    say("registered")
    await client.shutdown_event.wait()
    say(f"drain read-in={client.drain_received_in} set-on-loop={set_in == [loop_thread]}")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(engine(sys.argv[1], sys.argv[2]))
