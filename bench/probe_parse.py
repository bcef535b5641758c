"""What one read of an engine's in-flight gauges costs the coordinator's loop.

    python -m bench.probe_parse [--rounds 7] [--reads 200]

While a drain waits for an adopted engine, ``EngineProbe`` reads its Prometheus page every
0.1 s and sums the in-flight gauges, on the coordinator's event loop. Two ways over the same
pages, each a round in turn, ``--rounds`` times:

- ``whole page``: every family of the page through ``prometheus_client``'s parser, the
  gauges summed from it (how the probe read until now: the baseline);
- ``gauge lines``: ``coordinator.service.engine_probe.inflight``, which parses only the
  lines of the named gauges.

The pages are real ones, saved from the engines the tests run (``bench/data/``: vLLM 0.32.0
and SGLang 0.5.23 on the tiny model, after a few requests, so their histograms are filled).
Printed: microseconds of CPU per read (``time.process_time``), the median of the rounds, the
ratio, and that both ways give the same count.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from coordinator.engines import PROFILES
from coordinator.service.engine_probe import inflight

DATA = Path(__file__).resolve().parent / "data"
PAGES = {"vllm": DATA / "vllm_metrics.txt", "sglang": DATA / "sglang_metrics.txt"}


def whole_page(text: str, names: tuple[str, ...]) -> int | None:
    """The baseline: the whole page parsed, the named gauges summed."""
    wanted = set(names)
    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value):
                total += sample.value
                found = True
    return max(0, round(total)) if found else None


def cpu_per_read_us(way: Callable[[str, tuple[str, ...]], int | None], text: str,
                    names: tuple[str, ...], reads: int) -> float:
    start = time.process_time()
    for _ in range(reads):
        way(text, names)
    return (time.process_time() - start) / reads * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    for engine, page in PAGES.items():
        text = page.read_text()
        names = PROFILES[engine].inflight_metrics
        same = whole_page(text, names) == inflight(text, names)
        rounds: dict[str, list[float]] = {"whole page": [], "gauge lines": []}
        for _ in range(args.rounds):
            rounds["whole page"].append(cpu_per_read_us(whole_page, text, names, args.reads))
            rounds["gauge lines"].append(cpu_per_read_us(inflight, text, names, args.reads))
        base = statistics.median(rounds["whole page"])
        print(f"{engine}: {len(text) / 1024:.0f} KB page, {len(text.splitlines())} lines, "
              f"the same count both ways: {same}")
        for way, values in rounds.items():
            median = statistics.median(values)
            print(f"  {way:12} {median:9.1f} us CPU per read (rounds {min(values):.1f}-"
                  f"{max(values):.1f})  x{base / median:.1f} cheaper than the whole page"
                  if way != "whole page" else
                  f"  {way:12} {median:9.1f} us CPU per read (rounds {min(values):.1f}-"
                  f"{max(values):.1f})")


if __name__ == "__main__":
    main()
