"""Watch one coordinator's handoffs from a process of its own, for bench/drain.py.

    .venv/bin/python -m bench.handoff_observer URL

Prints ``<handed_back count> <time.time()>`` each time the count of handed-back requests on
``/status`` grows (first line: the count at start). Being its own process, it is not delayed
by the benchmark's client loop reading hundreds of streams.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.processes import ProcessJanitor  # noqa: E402


def observe(url: str) -> None:
    """Long-poll the router view of ``/status`` and print
    ``<handed_back count> <time.time()>`` whenever the count of handoffs grows (a process of
    its own, so the bench's busy client loop does not delay what it measures). The count, not
    the ``migrations`` list: a handoff whose ack came first is never listed as pending."""
    generation = -1
    count = -1
    with httpx.Client(timeout=60) as http:
        while True:
            params: dict[str, Any] = {"view": "router"}
            if generation >= 0:
                params.update(wait=10, since=generation)
            status = http.get(f"{url}/status", params=params).json()
            now = time.time()
            generation = status["generation"]
            if status["migration_counts"]["handed_back"] != count:
                count = status["migration_counts"]["handed_back"]
                print(f"{count} {now}", flush=True)


class Observer:
    """``observe`` in a process of its own; ``sightings`` fills in from a reader thread."""

    def __init__(self, janitor: ProcessJanitor, url: str) -> None:
        proc = janitor.spawn_python(["-m", "bench.handoff_observer", url], cwd=ROOT,
                                    stdout=subprocess.PIPE)
        assert proc.stdout is not None
        self._stdout = proc.stdout
        self.sightings: list[tuple[int, float]] = []
        """(handed_back count, time.time() it was first seen)."""
        self._read_line()
        threading.Thread(target=self._read, daemon=True).start()

    def _read_line(self) -> bool:
        line = self._stdout.readline().decode()
        if not line:
            return False  # the observer was ended with the run
        count, at = line.split()
        self.sightings.append((int(count), float(at)))
        return True

    def _read(self) -> None:
        while self._read_line():
            pass

    @property
    def count(self) -> int:
        return self.sightings[-1][0]

    def visible_at(self, after: int, n: int) -> list[float]:
        """When each of the ``n`` handoffs after the ``after``-th was first seen."""
        times = []
        for k in range(after + 1, after + n + 1):
            times.append(next(at for count, at in self.sightings if count >= k))
        return times


if __name__ == "__main__":
    observe(sys.argv[1])
