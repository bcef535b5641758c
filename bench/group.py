"""A multi-node engine's group drained per pod (today) against the group drain, in one run.

    .venv/bin/python -m bench.group [--quick] [--repetitions N] [--scenarios deletion,eviction]
                                    [--json FILE]

The group is a LeaderWorkerSet's shape, as tests/group runs it: a leader pod (the simulated
engine's HTTP front end and rank 0) and 3 follower pods (a rank each), joined by a collective
that hangs, then aborts, when a rank disappears while the leader issues a step; one
coordinator per pod; streams through the reference router, with a spare engine where
handed-back streams continue. It is drained two ways (``bench/group_rig.py``):

1. ``per-pod``: coordinators that know no group, each draining only its own pod;
2. ``group``: the same coordinators configured as a group (docs/group.md);

in two scenarios: ``deletion``, every preStop hook called at once, as a group deletion runs
them; ``eviction``, one follower's hook alone, as a node drain evicts its pod. The ways
alternate, ``--repetitions`` runs each per scenario.

For each way and scenario, summed over its runs (``bench/group_truth.py`` says whose word
each figure is): requests lost (streams not whole and exact against
``devstack.sim.expected_tokens``), streams broken at the leader (the router's count), ranks
crashed (their own records: cause, exit code), every process's exit code, time to empty (the
first hook's call to the last process of every pod ended) and when the hooks returned; then
the ratios, and plainly where the group drain is slower. Every process the bench starts is
ended by it (SIGTERM, SIGKILL fallback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.group_rig import GROUP, PER_POD, QUICK, SCENARIOS, WAYS, Params, evicted, run_once
from bench.group_truth import RunResult, WayTotals, comparison, format_counts, median

TITLES = {PER_POD: "per pod, no coordination", GROUP: "group drain"}


def header(params: Params) -> str:
    return (f"a group of {params.size} pods ({params.ranks_per_pod} rank(s) each, a coordinator "
            f"each) x {params.streams} streams of {params.max_tokens} tokens "
            f"({params.token_interval_ms:g} ms/token), collective timeout "
            f"{params.collective_timeout_s:g} s, {params.repetitions} run(s) per way and "
            f"scenario ({', '.join(params.scenarios)}; the eviction drains pod "
            f"{evicted(params.size)}), {os.cpu_count()} CPUs")


def run_line(run: RunResult, n: int) -> str:
    empty = "not empty" if run.empty_s is None else f"{run.empty_s:.2f} s"
    return (f"{run.scenario} {run.way} #{n}: lost {run.lost}/{run.streams}, broken at the "
            f"leader {run.broken}, ranks crashed "
            f"{run.crashed}/{run.ranks}, exit codes {format_counts(_codes(run))}, "
            f"empty {empty}, hooks {run.hooks_s:.2f} s, verdicts {', '.join(run.verdicts)}")


def _codes(run: RunResult) -> dict[str, int]:
    return dict(WayTotals.of(run.way, run.scenario, [run]).codes)


def table(totals: list[WayTotals]) -> list[str]:
    """The table, as docs/benchmarks.md shows it (Markdown)."""
    columns = ["scenario", "way", "runs", "streams", "lost", "tokens missing / duplicated",
               "broken at the leader", "ranks crashed", "rank causes",
               "exit codes, every process of every pod", "time to empty median / max s",
               "hooks returned median s", "coordinators' verdicts"]
    right = {"runs", "streams", "lost", "tokens missing / duplicated", "broken at the leader",
             "ranks crashed", "time to empty median / max s", "hooks returned median s"}
    lines = ["| " + " | ".join(columns) + " |",
             "| " + " | ".join("---:" if c in right else "---" for c in columns) + " |"]
    for t in totals:
        empty = (f"{median(t.empty_s):.2f} / {max(t.empty_s):.2f}" if t.empty_s else "—")
        if t.not_empty:
            empty += f" ({t.not_empty} not empty)"
        lines.append(
            f"| {t.scenario} | {TITLES[t.way]} | {t.runs} | {t.streams} | {t.lost} | "
            f"{t.tokens_missing} / {t.tokens_duplicated} | {t.broken} | {t.crashed} of {t.ranks} | "
            f"{format_counts(t.causes)} | {format_counts(t.codes)} | {empty} | "
            f"{median(t.hooks_s):.2f} | {format_counts(t.verdicts)} |")
    return lines


def report(params: Params, runs: list[RunResult], load: tuple[float, float]) -> str:
    totals = {(way, scenario): WayTotals.of(way, scenario, runs)
              for scenario in params.scenarios for way in WAYS}
    counters: dict[tuple[str, str], int] = {}
    lines = [header(params) + f"; load average {load[0]:.2f} before, {load[1]:.2f} after", ""]
    for run in runs:
        key = (run.way, run.scenario)
        counters[key] = counters.get(key, 0) + 1
        lines.append(run_line(run, counters[key]))
    lines += ["", *table(list(totals.values()))]
    for scenario in params.scenarios:
        lines += ["", *comparison(totals[PER_POD, scenario], totals[GROUP, scenario])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.streams} streams of {QUICK.max_tokens} tokens, "
                             f"{QUICK.repetitions} run per way")
    parser.add_argument("--repetitions", type=int, help="runs per way")
    parser.add_argument("--streams", type=int)
    parser.add_argument("--collective-timeout-s", type=float)
    parser.add_argument("--scenarios", help=f"comma-separated, of {','.join(SCENARIOS)}")
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    args = parser.parse_args()
    params = QUICK if args.quick else Params()
    changes = {k: v for k, v in (("repetitions", args.repetitions), ("streams", args.streams),
                                 ("collective_timeout_s", args.collective_timeout_s))
               if v is not None}
    params = replace(params, **changes)
    if args.scenarios:
        chosen = tuple(args.scenarios.split(","))
        if not chosen or set(chosen) - set(SCENARIOS):
            parser.error(f"--scenarios: a comma-separated list of {', '.join(SCENARIOS)}")
        params = replace(params, scenarios=chosen)

    print(header(params), file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    runs: list[RunResult] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-group-") as tmp:
        # Alternating, so that whatever else loads the machine falls on both ways alike.
        for n in range(params.repetitions):
            for scenario in params.scenarios:
                for way in WAYS:
                    where = Path(tmp) / f"{scenario}-{way}-{n}"
                    run = asyncio.run(run_once(way, scenario, params, where))
                    runs.append(run)
                    print(run_line(run, n + 1), file=sys.stderr, flush=True)
    load = (load_before, os.getloadavg()[0])
    print(report(params, runs, load))
    print(f"\n(whole run {time.monotonic() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"params": asdict(params), "load_average": load,
             "runs": [asdict(r) for r in runs]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
