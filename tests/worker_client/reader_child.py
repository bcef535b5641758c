"""An asyncio engine that only waits for a drain (run as a script, not collected).

    python reader_child.py COORDINATOR_URL loop|thread [follow]

Prints ``registered`` once its event stream is open, then, at each drain, one line
``drain read-in=<thread> set-on-loop=<bool> source=<how it learnt>``. With ``follow``, it
then prints ``deadline-known`` once the drain's deadline is known and ``aborted`` when the
drain is aborted, and waits for the next one. It ends by the coordinator's kill.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from worker_client import WorkerClient


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def engine(coordinator: str, reader: str, follow: bool) -> None:
    client = WorkerClient(coordinator, event_reader=reader).start()
    loop_thread = threading.current_thread().name
    set_in: list[str] = []
    client.on_drain(lambda: set_in.append(threading.current_thread().name))
    await asyncio.to_thread(client.registered.wait, 60)
    say("registered")
    while True:
        await client.shutdown_event.wait()
        say(f"drain read-in={client.drain_received_in} set-on-loop={set_in == [loop_thread]} "
            f"source={client.drain_source}")
        set_in.clear()
        if not follow:
            break
        # Polled: the client has no event for these; the test holds the drain meanwhile.
        while "deadline_at" not in (client.drain or {}):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        say("deadline-known")
        while client.shutdown_event.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        say("aborted")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(engine(sys.argv[1], sys.argv[2], sys.argv[3:] == ["follow"]))
