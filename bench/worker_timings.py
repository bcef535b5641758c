"""The bench's drain observer: one JSON line per drain and engine, for ``bench/drain_push.py``.

The engines are processes the bench starts but does not write, so it names this observer
in their environment (``WORKER_CLIENT_DRAIN_OBSERVER=bench.worker_timings:observe``) and
where to write (``BENCH_WORKER_TIMINGS``). Each line: the engine's pid, how the notice came
(``source``), the coordinator's drain start, when the notice was read and when
``shutdown_event`` was set (epoch s), and which thread read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading

from worker_client import DrainNotice

PATH_ENV = "BENCH_WORKER_TIMINGS"
OBSERVER = "bench.worker_timings:observe"
"""What the bench puts in ``WORKER_CLIENT_DRAIN_OBSERVER``."""
WRITE_DELAY_S = 0.5
"""The line is written this long after the notice: off the drain's critical path (every
engine of the pod is waking at that moment), and late enough for a doorbell's notice to have
learnt the drain's start from the line that follows it."""


def observe(notice: DrainNotice) -> None:
    path = os.environ.get(PATH_ENV)
    if not path:
        return
    try:
        asyncio.get_running_loop().call_later(WRITE_DELAY_S, _append, path, notice)
    except RuntimeError:  # an engine without a loop
        threading.Timer(WRITE_DELAY_S, _append, (path, notice)).start()


def _append(path: str, notice: DrainNotice) -> None:
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(dataclasses.asdict(notice)) + "\n")
