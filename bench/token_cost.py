"""What ``worker_client`` costs an engine per streamed token, against the bare stream.

    python -m bench.token_cost [--items 200000] [--rounds 7]

The engine's main process pays this on every token of every stream (SGLang's tokenizer
manager, vLLM's API server), often the engine's own CPU bottleneck. Three ways to consume the
same bare async generator of ``--items`` items (it yields without awaiting anything, so what
is timed is the consuming alone), each a round in turn, ``--rounds`` times:

- ``bare``: ``async for item in source``;
- ``tracked``: ``async with client.track(rid) as req: async for item in req.stream(source)``,
  with a ``WorkerClient`` that has no coordinator (the per-token path is the same with one:
  nothing per token goes over the network);
- ``decorated``: the same through ``client.tracked_stream`` (the decorator form).

Printed: nanoseconds of CPU per item (``time.process_time``, so a busy machine's other
processes do not count), the median of the rounds, and each way's cost over the bare one.
The garbage collector is off while timing. Run it with ``--cpu N`` to pin it to one CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from worker_client import WorkerClient


async def source(n: int) -> AsyncIterator[int]:
    """The engine's own stream, at its cheapest: nothing awaited between items."""
    for i in range(n):
        yield i


async def bare(_client: WorkerClient, n: int) -> int:
    count = 0
    async for _ in source(n):
        count += 1
    return count


async def tracked(client: WorkerClient, n: int) -> int:
    count = 0
    async with client.track("bench") as req:
        async for _ in req.stream(source(n)):
            count += 1
    return count


async def decorated(client: WorkerClient, n: int) -> int:
    count = 0
    async for _ in client.tracked_stream(source)(n):
        count += 1
    return count


Way = Callable[[WorkerClient, int], Coroutine[Any, Any, int]]
WAYS: dict[str, Way] = {"bare": bare, "tracked": tracked, "decorated": decorated}


def time_one(loop: asyncio.AbstractEventLoop, client: WorkerClient, way: Way, n: int) -> float:
    """CPU nanoseconds per item of one run (in a task of its own, as a request is)."""
    gc.collect()
    gc.disable()
    try:
        cpu0 = time.process_time_ns()
        count = loop.run_until_complete(loop.create_task(way(client, n)))
        cpu = time.process_time_ns() - cpu0
    finally:
        gc.enable()
    if count != n:
        raise RuntimeError(f"{count} items of {n}")
    return cpu / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    loop = asyncio.new_event_loop()
    client = WorkerClient(None)
    client.start(loop)
    try:
        for way in WAYS.values():  # warm-up: imports, caches, the specializing interpreter
            time_one(loop, client, way, min(args.items, 20_000))
        runs: dict[str, list[float]] = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, way in WAYS.items():
                runs[name].append(time_one(loop, client, way, args.items))
    finally:
        client.close()
        loop.close()
    load = os.getloadavg()[0]
    print(f"CPU per item, {args.items:,} items, median of {args.rounds} rounds "
          f"(load average {load:.2f})")
    base = statistics.median(runs["bare"])
    for name, values in runs.items():
        med = statistics.median(values)
        spread = f"{min(values):.0f}-{max(values):.0f}"
        extra = "" if name == "bare" else f"  +{med - base:.0f} ns over bare (x{med / base:.1f})"
        print(f"  {name:<10} {med:7.0f} ns  (rounds {spread}){extra}")


if __name__ == "__main__":
    main()
