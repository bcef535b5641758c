"""A rolling update under load: every pod of a Deployment behind ``smg`` replaced, four ways.

    .venv/bin/python -m bench.rollout [--quick] [--strategies plain,sleep-wait,...]
                                      [--json FILE]

Six simulated pods behind a real SGLang Model Gateway (``smg``), clients streaming
completions back to back through it, and every pod replaced one after another as a
Deployment with ``maxSurge: 1, maxUnavailable: 0`` does it: start a new pod, wait until it
is Ready (its coordinator's ``/readyz`` answers 200, with one, and smg routes to it), then
delete an old one (``bench/rollout_pods.py``: endpoint removal, preStop hook, SIGTERM, the
grace period). As in Kubernetes by default, the next new pod starts as soon as the old one
is terminating: the Deployment controller does not count terminating pods (unless
``podReplacementPolicy`` says otherwise), so old pods may end side by side.

The strategies, each a whole rollout of the same fleet in the same run:

1. ``plain``: no preStop; the router drops the pod after the endpoint delay, the engine
   (stock: it SIGKILLs its tree) gets SIGTERM at once;
2. ``sleep-wait``: ``preStop: sleep N``, then SIGTERM, and the engine serves its open streams
   to their end before exiting (what KServe and the Gateway API inference extension ship);
3. ``coordinator``: the coordinator without continuation: the hook drains through it (smg
   told at the drain's start), in-flight streams are handed back, and the client, talking to
   smg directly, sees the stream end with the handed-back event: cut, its rest lost;
4. ``continuation``: the same pods, the clients talking to the continuation proxy in front
   of smg (``python -m continuation_proxy``), which continues each handed-back stream through
   smg on another pod. Left out (and said so) when the proxy is not installed.

Two controls follow, not ways to deploy: each takes one thing in or out of a strategy's
rollout, to show what that thing costs on the machine the bench runs on (their numbers are
printed, not judged against the goals):

5. ``continuation-prestarted``: ``continuation`` with the new pods' coordinators started
   before the steady state, so the rollout starts only their engines (no Deployment can do
   this: a pod's sidecar starts with the pod);
6. ``sleep-wait-proxied``: ``sleep-wait`` with the clients behind the continuation proxy,
   which then has nothing to continue: what its hop costs under the rollout's load.

For each: requests failed, streams cut, tokens lost and duplicated (``bench/rollout_load.py``
says how each is counted, against the engine's deterministic tokens), p50/p99 time to first
token and inter-token latency during the rollout against the steady state measured just
before it with the same load, and the rollout's total time (the first new pod's start to the
last old pod's last process gone). The goals are printed met or not, from the numbers.
Every process the bench starts is ended by ``LocalStack.close`` (the project's kill engine).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.rollout_cpu import CpuByRole
from bench.rollout_load import (
    Received,
    Tally,
    handover_gaps,
    percentile,
    read_streams,
    slow_gaps,
    tally,
)
from bench.rollout_pods import Deletion, Deployment, Kube, Strategy
from devstack.local_stack import LocalStack, Popen

STRATEGIES = (
    Strategy("plain", "plain SIGTERM"),
    Strategy("sleep-wait", "preStop sleep + engine's graceful wait", prestop_sleep=True,
             engine_wait=True),
    Strategy("coordinator", "coordinator, no continuation", coordinator=True),
    Strategy("continuation", "coordinator + continuation proxy", coordinator=True,
             continuation=True),
    Strategy("continuation-prestarted",
             "control: coordinator + continuation proxy, coordinators started before",
             coordinator=True, continuation=True, prestarted=True,
             control="continuation with the new pods' coordinators started before the "
                     "steady state: the rollout without the coordinators' start"),
    Strategy("sleep-wait-proxied", "control: preStop sleep + engine's wait, behind the proxy",
             prestop_sleep=True, engine_wait=True, continuation=True,
             control="sleep-and-wait with the clients behind the continuation proxy, which "
                     "has nothing to continue: the proxy's hop under the rollout's load"),
)
BASELINE = "sleep-wait"
ITL_TOLERANCE = 1.10
"""Goal: p99 inter-token latency during the rollout within 10 % of the steady state."""
PROXY_START_TIMEOUT_S = 30.0
LOAD_STOP_TIMEOUT_S = 60.0
"""The load process ends once its streams in flight ended (a 2 s stream, or a continued one)."""


@dataclass(frozen=True)
class Params:
    """The load and the fleet. A stream is ``max_tokens`` times ``token_interval_ms`` long (2 s
    by default): long enough that every deletion finds streams in flight, short enough that
    the sleep-and-wait baseline's engine finishes them within the grace period."""

    pods: int = 6
    clients: int = 12
    """Streams in flight at once: two per pod."""
    max_tokens: int = 100
    token_interval_ms: float = 20.0
    warmup_s: float = 3.0
    """Load before the steady state is measured (the first streams all start together)."""
    steady_s: float = 12.0
    """About 40 whole streams and 4,000 inter-token gaps at 12 clients: enough for a p99."""


QUICK = Params(pods=2, clients=4, max_tokens=50, warmup_s=2.0, steady_s=4.0)


@dataclass
class Result:
    strategy: Strategy
    steady: Tally
    rollout: Tally
    rollout_s: float
    """First new pod started → last old pod's processes gone."""
    ready_s: float
    """First new pod started → last new pod Ready (where ``kubectl rollout status`` ends)."""
    surges: list[tuple[float, float]]
    """Each new pod's start and Ready (``time.monotonic()``): a coordinator pod starts its
    coordinator before its engine, as a native sidecar does."""
    load_average: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average when the strategy started and ended (other work
    on the same cores shows here)."""
    deletions: list[Deletion] = field(default_factory=list)
    sent: list[Received] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Every engine's own request log, old and new pods (``Pod.requests()``)."""
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    """Cores used by each part of the stack, ``steady`` and ``rollout``
    (``bench/rollout_cpu.py``)."""


def proxy_installed() -> bool:
    return (importlib.util.find_spec("continuation_proxy") is not None
            and importlib.util.find_spec("router_client.continuation") is not None)


async def run_strategy(strategy: Strategy, params: Params, kube: Kube, workdir: Path,
                       popen: Popen | None = None) -> Result:
    """One whole rollout:

    1. ``params.pods`` pods behind a new smg (and the continuation proxy in front, for
       ``continuation``);
    2. the load (``bench/rollout_load.py``, a process of its own), ``warmup_s`` of it
       unmeasured (the load process starting included), then ``steady_s`` of steady state;
    3. each old pod in turn: a new pod started and Ready, then the old one deleted (its end
       runs on while the next new pod starts);
    4. once every old pod is gone, the load stops; the streams in flight end;
    5. every process ended; the engines' request logs read.

    ``popen`` starts every process (``LocalStack``'s; a test passes its janitor's).
    """
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    stack = LocalStack(workdir, popen)
    ends: list[asyncio.Task[Deletion]] = []
    cpu = CpuByRole()
    try:
        cpu.start()
        deployment = Deployment(stack, strategy, kube, token_interval_ms=params.token_interval_ms)
        await asyncio.to_thread(deployment.start, params.pods)
        new_pods = [f"new{i}" for i in range(params.pods)]
        if strategy.prestarted:
            await asyncio.to_thread(deployment.prestart, new_pods)
        url = deployment.router.url
        if strategy.continuation:
            url = await asyncio.to_thread(_start_proxy, stack, url, deployment)
        streams = workdir / "streams.json"
        clients = stack.spawn([sys.executable, "-m", "bench.rollout_load", "--url", url,
                               "--clients", str(params.clients), "--max-tokens",
                               str(params.max_tokens), "--prefix", strategy.name,
                               "--out", str(streams)], "load.log")
        await asyncio.sleep(params.warmup_s)
        steady_from = time.monotonic()
        await asyncio.sleep(params.steady_s)
        started = time.monotonic()
        surges: list[tuple[float, float]] = []
        for i, old in enumerate(list(deployment.pods)):
            began = started if i == 0 else time.monotonic()  # one start for both filters
            await asyncio.to_thread(deployment.surge, new_pods[i])
            surges.append((began, time.monotonic()))
            ends.append(asyncio.create_task(deployment.delete(old)))
        ready_s = time.monotonic() - started
        deletions = list(await asyncio.gather(*ends))
        # To the last old pod's last process (its endpoint removal may come later).
        rollout_s = max((d.gone_at for d in deletions if d.gone_at is not None),
                        default=time.monotonic()) - started
        clients.send_signal(signal.SIGTERM)  # no new stream; those in flight end
        if await asyncio.to_thread(clients.wait, LOAD_STOP_TIMEOUT_S) != 0:
            raise RuntimeError(f"the load exited {clients.returncode}: see {workdir}/load.log")
        sent = await asyncio.to_thread(read_streams, streams)
    finally:
        for end in ends:  # a failed rollout: its deletions stop (their hooks are killed)
            end.cancel()
        await asyncio.gather(*ends, return_exceptions=True)
        cpu.stop()
        await stack.close()
    steady = [s for s in sent if s.sent_at >= steady_from and (s.ended_at or 0) <= started]
    during = [s for s in sent if (s.ended_at or 0) > started]
    requests = [r for pod in deployment.pods for r in pod.requests()]
    cores = {"steady": cpu.cores(steady_from, started),
             "rollout": cpu.cores(started, started + rollout_s)}
    return Result(strategy, tally(steady), tally(during), rollout_s, ready_s, surges,
                  (load_before, os.getloadavg()[0]), deletions, sent, requests, cores)


def _start_proxy(stack: LocalStack, upstream: str, deployment: Deployment) -> str:
    """The continuation proxy in front of smg, acknowledging handoffs to the old pods'
    coordinators (the only ones drained)."""
    ready = stack.workdir / "proxy.json"
    coordinators = [arg for pod in deployment.pods if pod.coordinator is not None
                    for arg in ("--coordinator", pod.coordinator.url)]
    proc = stack.spawn([sys.executable, "-m", "continuation_proxy", "--upstream", upstream,
                        *coordinators, "--port", "0", "--ready-file", str(ready)], "proxy.log")
    deadline = time.monotonic() + PROXY_START_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the continuation proxy did not start (exit {proc.poll()}); "
                               f"see {stack.workdir / 'proxy.log'}")
        time.sleep(0.02)
    return str(json.loads(ready.read_text())["url"])


# --- goals and report ------------------------------------------------------------------------

def goals(result: Result, baseline: Result | None) -> list[tuple[str, bool | None, str]]:
    """(goal, met, the numbers); ``met`` None when it cannot be judged."""
    r, s = result.rollout, result.steady
    itl_goal: bool | None = None
    itl_note = "no samples"
    if r.itl_ms[1] is not None and s.itl_ms[1] is not None:
        itl_goal = r.itl_ms[1] <= s.itl_ms[1] * ITL_TOLERANCE
        itl_note = f"{r.itl_ms[1]:.1f} ms vs {s.itl_ms[1]:.1f} ms steady " \
                   f"({r.itl_ms[1] / s.itl_ms[1]:.2f}x)"
    time_goal: bool | None = None
    time_note = "no baseline in this run"
    if baseline is not None:
        time_goal = result.rollout_s <= baseline.rollout_s
        time_note = f"{result.rollout_s:.1f} s vs {baseline.rollout_s:.1f} s"
    return [
        ("0 failed", r.failed == 0, str(r.failed)),
        ("0 cut", r.cut == 0, str(r.cut)),
        ("0 lost", r.lost == 0, str(r.lost)),
        ("p99 ITL within 10% of steady", itl_goal, itl_note),
        ("rollout no slower than sleep-wait", time_goal, time_note),
    ]


def _ms(pair: tuple[float | None, float | None]) -> str:
    return " / ".join("-" if v is None else f"{v:.1f}" for v in pair)


def table(results: list[Result]) -> list[str]:
    """The headline table (Markdown)."""
    lines = [
        "| strategy | streams | failed | cut | tokens lost | duplicated | TTFT p50 / p99 ms "
        "steady → rollout | ITL p50 / p99 ms steady → rollout | rollout s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
    ]
    for res in results:
        r, s = res.rollout, res.steady
        lines.append(f"| {res.strategy.label} | {r.streams} | {r.failed} | {r.cut} | {r.lost} | "
                     f"{r.duplicated} | {_ms(s.ttft_ms)} → {_ms(r.ttft_ms)} | "
                     f"{_ms(s.itl_ms)} → {_ms(r.itl_ms)} | {res.rollout_s:.1f} |")
    return lines


def report(results: list[Result], params: Params, kube: Kube, left_out: list[str]) -> str:
    baseline = next((r for r in results if r.strategy.name == BASELINE), None)
    out = [f"rollout: {params.pods} pods behind smg, {params.clients} clients, "
           f"{params.max_tokens}-token streams at {params.token_interval_ms:g} ms a token; "
           f"endpoint delay {kube.endpoint_delay_s:g} s, preStop sleep "
           f"{kube.prestop_sleep_s:g} s, engine wait {kube.engine_wait_s:g} s, grace period "
           f"{kube.grace_period_s:g} s; {os.cpu_count()} CPUs, {platform.platform()}, "
           f"Python {platform.python_version()}", ""]
    out += table(results)
    out.append("")
    for res in results:
        if res.strategy.control:  # not a way to deploy: its numbers, not verdicts
            marks = [f"{goal}: {note}" for goal, _, note in goals(res, baseline)]
            out.append(f"{res.strategy.name} (control: {res.strategy.control}): "
                       + "; ".join(marks))
        else:
            marks = [f"{goal}: {'met' if met else 'unjudged' if met is None else 'NOT met'} "
                     f"({note})" for goal, met, note in goals(res, baseline)]
            out.append(f"{res.strategy.name}: " + "; ".join(marks))
        ends = [d for d in res.deletions if d.gone_at is not None]
        took = [d.gone_at - d.deleted_at for d in ends if d.gone_at is not None]
        starting = [ready - began for began, ready in res.surges]
        out.append(f"  new pods Ready after {res.ready_s:.1f} s (each {min(starting):.1f}-"
                   f"{max(starting):.1f} s), the last old pod gone "
                   f"{res.rollout_s - res.ready_s:.1f} s later; old pods deleted → gone "
                   f"{min(took, default=0):.1f}-{max(took, default=0):.1f} s; engine exits "
                   f"{sorted({d.engine_exit for d in ends}, key=str)}; hook exits "
                   f"{sorted({d.hook_exit for d in ends}, key=str)}; SIGKILLed by the kubelet: "
                   f"{[k for d in ends for k in d.sigkilled] or 'none'}; load average "
                   f"{res.load_average[0]:.1f} → {res.load_average[1]:.1f}")
        out += _latency_notes(res)
        out.append(f"  {_cpu_note(res)}")
        for line in res.rollout.errors[:3]:
            out.append(f"  e.g. {line}")
        for note in sorted({n for d in ends for n in d.notes})[:3]:
            out.append(f"  note: {note}")
    for why in left_out:
        out.append(f"left out: {why}")
    return "\n".join(out)


def _cpu_note(res: Result) -> str:
    """Cores of the machine each part used, steady → rollout (the rollout's order)."""
    steady, rollout = res.cpu.get("steady", {}), res.cpu.get("rollout", {})
    parts = [f"{part} {steady.get(part, 0.0):.2f} → {used:.2f}" for part, used in rollout.items()
             if used >= 0.005 or steady.get(part, 0.0) >= 0.005]
    total = f"{sum(steady.values()):.2f} → {sum(rollout.values()):.2f}"
    return f"cores used, steady → rollout: {total} of {os.cpu_count()} ({', '.join(parts)})"


def _latency_notes(res: Result) -> list[str]:
    """Where the rollout's slow inter-token gaps come from: new pods starting on the same
    cores, and (with continuation) the stitch of each handed-back stream."""
    notes = []
    steady_p99 = res.steady.itl_ms[1]
    if steady_p99 is not None:
        during = [s for s in res.sent if (s.ended_at or 0) > res.surges[0][0]]
        slow, inside = slow_gaps(during, steady_p99 * ITL_TOLERANCE, res.surges)
        starting = sum(ready - began for began, ready in res.surges) / res.rollout_s
        notes.append(f"  gaps over {steady_p99 * ITL_TOLERANCE:.1f} ms (steady p99 + 10%): "
                     f"{slow} of {res.rollout.itl_samples}, {inside} of them while a new pod "
                     f"was starting (new pods were starting {starting:.0%} of the rollout)")
    stitches = handover_gaps(res.sent, res.requests)
    if stitches:
        # A continuation smg still sent to the draining pod: handed back before any token.
        refused = sum(r["how"] == "handed_back" and r["tokens"] == 0
                      and not str(r["request_id"]).endswith(".0") for r in res.requests)
        notes.append(f"  continued streams' stitch: {len(stitches)} gaps, p50 "
                     f"{percentile(stitches, 50):.1f} ms, max {max(stitches):.1f} ms; "
                     f"{refused} continuations sent back to the draining pod and retried")
    return notes


def _as_json(results: list[Result], params: Params, kube: Kube) -> dict[str, Any]:
    return {"params": asdict(params), "kube": asdict(kube), "cpus": os.cpu_count(),
            "results": [{"strategy": r.strategy.name, "control": bool(r.strategy.control),
                         "steady": r.steady.as_dict(),
                         "rollout": r.rollout.as_dict(), "rollout_s": r.rollout_s,
                         "ready_s": r.ready_s, "surges": r.surges,
                         "load_average": r.load_average, "cpu": r.cpu,
                         "deletions": [asdict(d) for d in r.deletions]}
                        for r in results]}


async def run(names: list[str], params: Params, kube: Kube, workdir: Path) -> list[Result]:
    results = []
    for strategy in STRATEGIES:
        if strategy.name in names:
            print(f"… {strategy.label}", file=sys.stderr, flush=True)
            results.append(await run_strategy(strategy, params, kube, workdir / strategy.name))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.pods} pods, {QUICK.clients} clients, shorter steady state")
    parser.add_argument("--strategies", default=",".join(s.name for s in STRATEGIES),
                        help="comma list (default: all)")
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the logs and request logs here (default: a temporary "
                             "directory)")
    args = parser.parse_args(argv)
    params = QUICK if args.quick else Params()
    if args.pods:
        params = replace(params, pods=args.pods)
    kube = Kube()
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    unknown = set(names) - {s.name for s in STRATEGIES}
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}")
    left_out = []
    if not proxy_installed():
        for strategy in STRATEGIES:
            if strategy.continuation and strategy.name in names:
                names.remove(strategy.name)
                left_out.append(f"{strategy.name} (the continuation proxy, "
                                "continuation_proxy/, is not installed in this checkout)")
    with tempfile.TemporaryDirectory(prefix="rollout-") as tmp:
        workdir = args.keep or Path(tmp)
        results = asyncio.run(run(names, params, kube, workdir))
    print(report(results, params, kube, left_out))
    if args.json:
        args.json.write_text(json.dumps(_as_json(results, params, kube), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
