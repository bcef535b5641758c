"""How soon a real router stops sending new requests to a draining pod, three ways, in one run.

    .venv/bin/python -m bench.routers [--routers smg,vllm-router] [--adapter-reps 40]
        [--kubernetes-reps 20] [--health-reps 8] [--continuation-drains 4] [--clients 16]
        [--pods 3] [--seed 1]

For each router (SGLang Model Gateway ``smg``, ``vllm-router``, from .engines/routers):
three simulated pods behind it (``LocalStack.start_routed_pods``), a closed-loop streaming
load of short requests through it, and one pod at a time drained while the load runs. The
figure is the time from the drain's start (the coordinator's ``drain.started_at``) to the
last request the drained engine took (its own request log): with the coordinator's router
adapter, with the router's own health check only, and with a simulated Kubernetes
readiness removal (``bench/routers_rig.py`` says how each works and what the simulated
delay is). Printed side by side: p50, p99 and max, the requests that still reached the
pod, and each strategy's p50 and p99 against the adapter's.

The adapter's goal is ≤ 50 ms at p99. The second measure (``bench/routers_continuation.py``):
requests lost and tokens duplicated or missing while pods drain behind each router, with the
continuation proxy in front of it and without (goal: 0 and 0 with it). The third
(``bench/continuation_cost.py``, ``--cost-streams``): the continuation layer's cost at 64
streams against the router directly: added time to first token and p99 inter-token latency
(goal ≤ 1 ms), throughput ratio (goal ≥ 0.95), the proxy's CPU per 1,000 tokens.

Every process this script starts is ended by it (``LocalStack.close()``: SIGTERM by PID in
order, SIGKILL for stragglers).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import continuation_cost  # noqa: E402
from bench.drain_rig import pct  # noqa: E402
from bench.routers_continuation import SIDES, Damage, damage_table, measure_damage  # noqa: E402
from bench.routers_rig import (  # noqa: E402
    COORDINATOR,
    ENGINE,
    HEALTH_CHECK_S,
    HEALTH_FAILURES,
    MAX_TOKENS,
    STRATEGIES,
    Bench,
    EndpointDelay,
    Sample,
)
from devstack import routers  # noqa: E402
from devstack.local_stack import LocalStack  # noqa: E402
from devstack.routers import RouterLoad  # noqa: E402

GOAL_P99_MS = 50.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.routers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routers", default=",".join(routers.KINDS),
                        help="comma list of smg, vllm-router (default: both)")
    parser.add_argument("--adapter-reps", type=int, default=40)
    parser.add_argument("--kubernetes-reps", type=int, default=20)
    parser.add_argument("--health-reps", type=int, default=8,
                        help="each drains a pod to its end and starts a new one")
    parser.add_argument("--continuation-drains", type=int, default=4,
                        help="drains per router with and without the continuation proxy, "
                        "for the second measure (0: skip it)")
    parser.add_argument("--clients", type=int, default=16, help="streams at a time")
    parser.add_argument("--cost-streams", type=int, default=64,
                        help="streams of the third measure, the continuation layer's cost "
                        "(bench/continuation_cost.py) through the first router; 0: skip it")
    parser.add_argument("--cost-seconds", type=float, default=15.0,
                        help="seconds of each of its phases")
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1, help="of the simulated endpoint delay")
    parser.add_argument("--keep", action="store_true", help="keep the logs and records")
    args = parser.parse_args(argv)
    args.routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = set(args.routers) - set(routers.KINDS)
    if unknown:
        parser.error(f"unknown router(s): {', '.join(sorted(unknown))}")
    return args


async def measure(kind: str, adapter: bool, args: argparse.Namespace, workdir: Path,
                  rng: random.Random) -> list[Sample]:
    """1. Pods behind ``kind``, their coordinators with the adapter or without.
    2. The load through the router; every pod taking requests.
    3. The strategies of this fleet, one pod at a time in turn: ``adapter`` with the adapter;
       ``kubernetes`` then ``health`` (which replaces the pods it drains) without.
    4. Stop the load, end every process."""
    stack = LocalStack(workdir)
    samples: list[Sample] = []
    try:
        fleet = await asyncio.to_thread(
            stack.start_routed_pods, kind, args.pods, adapter=adapter,
            coordinator_args=COORDINATOR, health_check_interval_s=HEALTH_CHECK_S,
            router_args=["--health-failure-threshold", str(HEALTH_FAILURES)], **ENGINE)
        load = RouterLoad(fleet.router.url, clients=args.clients, max_tokens=MAX_TOKENS,
                          prefix=f"{kind}-{'a' if adapter else 'b'}")
        clients = asyncio.create_task(load.run())
        async with httpx.AsyncClient(timeout=30) as http:
            bench = Bench(stack, fleet, load, http, list(fleet.pods))
            try:
                for pod in bench.live:
                    await bench.serving(pod, 0.0)
                plan = [("adapter", args.adapter_reps)] if adapter else [
                    ("kubernetes", args.kubernetes_reps), ("health", args.health_reps)]
                delay = EndpointDelay()
                for strategy, reps in plan:
                    for i in range(reps):
                        pod = bench.live[i % len(bench.live)]
                        wait = delay.draw(rng) if strategy == "kubernetes" else 0.0
                        sample = await bench.rep(strategy, pod, wait)
                        samples.append(sample)
                        print(f"  {kind:<11} {strategy:<10} {i + 1:>3}/{reps}: last "
                              f"{sample.last_ms:7.1f} ms, {sample.reached:>3} reached, told "
                              f"{sample.told_ms:7.1f} ms, {sample.rate:4.0f} req/s", flush=True)
            finally:
                load.stop()
                await clients
        errors = sum(1 for s in load.sent if s.end == "error")
        print(f"  {kind}: {len(load.sent)} requests sent, {errors} ended in an error",
              flush=True)
    finally:
        await stack.close()
    return samples


def report(samples: list[Sample], kinds: list[str]) -> list[str]:
    """The side-by-side table (Markdown)."""
    lines = ["| router | strategy | n | p50 ms | p99 ms | max ms | reached p50 | told p50 ms "
             "| req/s to the pod | p50 x adapter | p99 x adapter |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind in kinds:
        adapter = [s for s in samples if s.router == kind and s.strategy == "adapter"]
        # A rep where no request reached the pod after the drain's start measures 0: floor
        # the adapter's figures at one request interval to the pod, their resolution.
        floor = 1000.0 / max(1.0, pct([s.rate for s in adapter], 0.5)) if adapter else 0.0
        base = [max(s.last_ms, floor) for s in adapter]
        for strategy in STRATEGIES:
            mine = [s for s in samples if s.router == kind and s.strategy == strategy]
            if not mine:
                continue
            last = [s.last_ms for s in mine]
            ratios = [_ratio(pct(last, q), pct(base, q)) if strategy != "adapter" else "1"
                      for q in (0.5, 0.99)]
            lines.append(
                f"| {kind} | {strategy} | {len(mine)} | {pct(last, 0.5):.1f} | "
                f"{pct(last, 0.99):.1f} | {max(last):.1f} | "
                f"{pct([float(s.reached) for s in mine], 0.5):.0f} | "
                f"{pct([s.told_ms for s in mine], 0.5):.1f} | "
                f"{pct([s.rate for s in mine], 0.5):.0f} | {ratios[0]} | {ratios[1]} |")
    return lines


def _ratio(value: float, base: float) -> str:
    if base != base or value != value or base <= 0:  # NaN: no samples
        return "—"
    return f"{value / base:.0f}"


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    rng = random.Random(args.seed)
    samples: list[Sample] = []
    for kind in args.routers:
        for adapter in (True, False):
            name = f"{kind}-{'adapter' if adapter else 'no-adapter'}"
            (workdir / name).mkdir()
            samples += await measure(kind, adapter, args, workdir / name, rng)
    print()
    print("\n".join(report(samples, args.routers)))
    worst = [pct([s.last_ms for s in samples if s.router == k and s.strategy == "adapter"],
                 0.99) for k in args.routers]
    met = all(w <= GOAL_P99_MS for w in worst)
    print(f"\nadapter p99 {' / '.join(f'{w:.1f}' for w in worst)} ms: goal ≤ {GOAL_P99_MS:.0f} "
          f"ms {'met' if met else 'NOT met'}")
    if args.continuation_drains > 0:
        damage: list[Damage] = []
        for kind in args.routers:
            for with_proxy in (False, True):
                name = f"{kind}-damage-{SIDES[with_proxy]}"
                (workdir / name).mkdir()
                damage.append(await measure_damage(kind, with_proxy, args.continuation_drains,
                                                   args.clients, workdir / name))
                print(f"  {kind:<11} {SIDES[with_proxy]} the proxy: {damage[-1]}", flush=True)
        print()
        print("\n".join(damage_table(damage)))
        proxied = [d for d in damage if d.side == "with"]
        zero = all(d.lost == 0 and d.duplicated == 0 for d in proxied)
        print(f"\nwith the continuation proxy: {sum(d.lost for d in proxied)} lost, "
              f"{sum(d.duplicated for d in proxied)} tokens duplicated: goal 0 and 0 "
              f"{'met' if zero else 'NOT met'}")
    if args.cost_streams > 0:
        # The third measure: what the continuation layer costs against the router directly.
        cost_args = continuation_cost.parse_args(
            ["--router", args.routers[0], "--streams", str(args.cost_streams),
             "--seconds", str(args.cost_seconds)])
        (workdir / "cost").mkdir()
        direct, proxy = await continuation_cost.measure(cost_args, workdir / "cost")
        print()
        print(continuation_cost.report(direct, proxy, cost_args))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not routers.installed():
        print("the routers are not installed: run scripts/engines.sh routers", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-routers-"))
    try:
        return asyncio.run(main_async(args, workdir))
    finally:
        if args.keep:
            print(f"logs and records kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
