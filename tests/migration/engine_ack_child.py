"""An engine whose requests are migrated by its own router (run as a script, not collected).

    python engine_ack_child.py COORDINATOR_URL N

Registers with ``handoff_ack="engine"`` (as a Dynamo worker does: its frontend migrates a
stream on its own and never acknowledges to the coordinator), starts N tracked requests that
never finish, prints ``serving`` once its event stream is open and the N are in flight, then
waits for the drain (which hands the N back) and for the coordinator's kill.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator

from worker_client import WorkerClient


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def endless() -> AsyncIterator[int]:
    yield 0
    await asyncio.Event().wait()
    yield 1


async def request(client: WorkerClient, request_id: str, entered: asyncio.Event) -> None:
    async with client.track(request_id) as req:
        entered.set()
        async for _ in req.stream(endless()):
            pass


async def engine(coordinator: str, n: int) -> None:
    client = WorkerClient(coordinator, handoff_ack="engine").start()
    entered = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(request(client, f"e{i}", entered[i])) for i in range(n)]
    await asyncio.to_thread(client.registered.wait, 60)
    for event in entered:
        await event.wait()
    say("serving")
    await asyncio.gather(*tasks)
    say("handed back")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(engine(sys.argv[1], int(sys.argv[2])))
