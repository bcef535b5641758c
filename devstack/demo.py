"""``shutdown-coordinator-demo``: drain one pod of three under streaming load, lose nothing.

    1. Start three pods on loopback, each a coordinator next to a simulated engine shaped like
       SGLang (HTTP main process, scheduler children with PDEATHSIG, a detokenizer; pod 0 also
       a data-parallel controller whose schedulers are its own children). Every engine
       registers with its pod's coordinator through ``worker_client``.
    2. Start the reference router in front of the three engines, watching their coordinators.
    3. Open many concurrent streaming completions through the router.
    4. Once every stream is flowing, drain pod 0 with ``GET /drain`` — what the kubelet's
       ``preStop`` hook does — and wait for its summary.
    5. Check every client stream against the tokens it should have received, and print what
       was migrated, lost, duplicated or missing, the drain's timeline and every process's fate.
    6. End every process the demo started.

Exit status 0 when nothing was lost and the drained pod ended gracefully, 1 otherwise.
The console script ``shutdown-coordinator-demo`` (or ``python -m devstack.demo``) runs it; the
product's ``shutdown-coordinator`` command does not, as no product module imports ``devstack``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from coordinator.cli import ending
from coordinator.service.render import table
from devstack.local_stack import LocalStack, Pod
from devstack.streaming_load import ClientStream, StreamingLoad

PASSED = 0
FAILED = 1


@dataclass
class Tally:
    """The client side of the run."""

    sent: int = 0
    completed: int = 0
    lost: int = 0
    exact: int = 0
    expected_tokens: int = 0
    received_tokens: int = 0
    missing_tokens: int = 0
    duplicated_tokens: int = 0

    @classmethod
    def of(cls, streams: Sequence[ClientStream]) -> Tally:
        tally = cls(sent=len(streams))
        for s in streams:
            missing, duplicated = s.missing_duplicated()
            tally.completed += s.done
            tally.lost += not s.done
            tally.exact += s.exact
            tally.expected_tokens += len(s.expected())
            tally.received_tokens += len(s.tokens)
            tally.missing_tokens += missing
            tally.duplicated_tokens += duplicated
        return tally

    @property
    def perfect(self) -> bool:
        return (self.lost == 0 and self.exact == self.sent and self.missing_tokens == 0
                and self.duplicated_tokens == 0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="shutdown-coordinator-demo", allow_abbrev=False,
        description="Drain one of three simulated engine pods under streaming load.")
    parser.add_argument("--streams", type=int, default=48,
                        help="concurrent streaming requests (default 48)")
    parser.add_argument("--tokens", type=int, default=60,
                        help="tokens per request (default 60)")
    parser.add_argument("--token-interval-ms", type=float, default=40.0,
                        help="time between two tokens of one stream (default 40)")
    parser.add_argument("--teardown-s", type=float, default=0.5,
                        help="cleanup each engine process runs after SIGTERM (default 0.5)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the working directory with every process's log")
    parser.add_argument("--timeline", metavar="FILE.html", type=Path,
                        help="write the drained pod's timeline page (GET /status/timeline: "
                        "phases, every process's signals and exit, handoffs) to FILE.html")
    args = parser.parse_args(list(argv))
    if args.streams < 1 or args.tokens < 4 or args.token_interval_ms <= 0:
        parser.error("--streams must be >= 1, --tokens >= 4, --token-interval-ms > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status (``INTERRUPTED`` after Ctrl-C, every process
    of the demo ended; the result's own code whatever became of its reader: ``ending``)."""
    with ending.tolerant_streams():
        args = parse_args(sys.argv[1:] if argv is None else argv)
        try:
            return _main(args)
        except KeyboardInterrupt:
            return ending.interrupted("the demo stopped; its pods, router and streams were "
                                      "ended")


def _main(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="shutdown-coordinator-demo-"))
    try:
        return asyncio.run(_run(args, workdir))
    finally:
        if args.keep:
            print(f"\nlogs and records kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


async def _run(args: argparse.Namespace, workdir: Path) -> int:
    stack = LocalStack(workdir)
    try:
        return await _scenario(args, stack)
    finally:
        await stack.close()


async def _scenario(args: argparse.Namespace, stack: LocalStack) -> int:
    engine = {"token_interval_ms": args.token_interval_ms, "teardown_s": args.teardown_s,
              "graceful_main": True, "schedulers": 2}
    print("shutdown-coordinator-demo")
    print("  starting 3 pods (coordinator + simulated engine each) and the reference router ...")
    pods = await asyncio.to_thread(_start_pods, stack, engine)
    router = await asyncio.to_thread(stack.start_router, pods)
    drained = pods[0]
    print(f"  pod 0: {_describe(drained)}")
    print(f"  {args.streams} streaming requests x {args.tokens} tokens through {router}")

    load = StreamingLoad(router, [f"demo prompt {i}: once upon a time"
                                  for i in range(args.streams)],
                         args.tokens, request_id_prefix="demo-")
    clients = asyncio.create_task(load.run())
    await asyncio.wait_for(load.flowing.wait(), 120)
    print("  every stream is flowing; draining pod 0 with GET /drain (as the kubelet's preStop)")
    began = time.monotonic()
    summary = await asyncio.to_thread(_drain, drained)
    drain_s = time.monotonic() - began
    streams = await asyncio.wait_for(clients, 300)
    stats = (await asyncio.to_thread(httpx.get, f"{router}/stats", timeout=10)).json()
    main_exit = await asyncio.to_thread(drained.engine.proc.wait, 30)
    if args.timeline is not None:
        page = await asyncio.to_thread(httpx.get, f"{drained.coordinator.url}/status/timeline",
                                       timeout=30)
        page.raise_for_status()
        args.timeline.write_text(page.text, encoding="utf-8")

    tally = Tally.of(streams)
    graceful = _print_report(tally, stats, summary, drained, main_exit, drain_s)
    ok = tally.perfect and graceful and main_exit == 0
    if args.timeline is not None:
        print(f"\npod 0's drain, drawn: {args.timeline}")
    print(f"\nresult: {'PASS' if ok else 'FAIL'} — "
          + ("nothing lost, every process of the drained pod ended gracefully"
             if ok else "see above"))
    return PASSED if ok else FAILED


def _start_pods(stack: LocalStack, engine: dict[str, Any]) -> list[Pod]:
    # Pod 0, the one drained, also has a data-parallel controller: the shape whose schedulers
    # die mid-cleanup through PDEATHSIG when a naive shutdown kills the controller first.
    return [stack.start_pod(f"pod{i}", **{**engine, "dp": 2 if i == 0 else 0})
            for i in range(3)]


def _describe(pod: Pod) -> str:
    roles = Counter(pod.roles().values())
    return ", ".join(f"{n} {role}" for role, n in roles.items())


def _drain(pod: Pod) -> dict[str, Any]:
    response = httpx.get(pod.coordinator.url + "/drain", timeout=120)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def _offset(at: float | None, origin: float | None) -> str | None:
    """``at`` as milliseconds after ``origin`` (the kill's first signal)."""
    if at is None or origin is None:
        return None
    return f"+{(at - origin) * 1000:.0f}"


def _print_report(tally: Tally, stats: dict[str, Any], summary: dict[str, Any], pod: Pod,
                  main_exit: int, drain_s: float) -> bool:
    print("\nrequests")
    print(f"  sent {tally.sent}   completed {tally.completed}   "
          f"migrated {stats.get('handed_back', 0)}   lost {tally.lost}   "
          f"exact {tally.exact}/{tally.sent}")
    print("tokens")
    print(f"  expected {tally.expected_tokens}   received {tally.received_tokens}   "
          f"missing {tally.missing_tokens}   duplicated {tally.duplicated_tokens}")

    print(f"\ndrain of pod 0 (GET /drain answered after {drain_s * 1000:.0f} ms)")
    timeline = [t for t in summary.get("timeline", []) if t["phase"] != "serving"]
    start = timeline[0]["at"] if timeline else 0.0
    for entry in timeline:
        note = f"  {entry['note']}" if entry.get("note") else ""
        print(f"  +{(entry['at'] - start) * 1000:8.1f} ms  {entry['phase']:<12}{note}")

    roles = pod.roles()
    print("\nprocesses of pod 0, in the order they ended (ms after the kill's first signal)")
    first = min((p["signalled_at"] for p in summary.get("processes", [])
                 if p.get("signalled_at")), default=None)
    processes = sorted(summary.get("processes", []),
                       key=lambda p: (p.get("ended_at") or float("inf"), p["pid"]))
    rows = [[p["pid"], roles.get(p["pid"], p.get("role") or p.get("name") or "?"), p["fate"],
             p.get("signal"), _offset(p.get("signalled_at"), first),
             _offset(p.get("ended_at"), first),
             None if p.get("elapsed_ms") is None else f"{p['elapsed_ms']:.0f}",
             "?" if p.get("exit_code") is None else p["exit_code"]] for p in processes]
    print(textwrap.indent(table(["pid", "role", "fate", "signal", "signalled", "ended",
                                 "took ms", "exit"], rows), "  "))
    print(f"  engine main process exit status: {main_exit}")
    records = pod.engine.records()
    unfinished = [r for r in records if r.get("cleanup") != "finished"]
    print(f"  cleanup finished in {len(records) - len(unfinished)} of {len(records)} "
          "engine processes")
    graceful = all(p["fate"] in ("exited", "gone") for p in processes) and not unfinished
    return graceful and bool(processes)


if __name__ == "__main__":
    sys.exit(main())
