"""Chaos soak: many drains in a row, of every kind, under streaming load, checked against
ground truth.

    .venv/bin/python -m bench.soak [--drains 1000] [--seed S] [--pods 3] [--max-seconds S]
    .venv/bin/python -m bench.soak --drains 50 --max-seconds 170      # the CI version

1. Start ``--pods`` pods on loopback, each a coordinator (token, state file) and a simulated
   engine registered with it, each engine in a unit of its own (a cgroup, else a mount
   namespace), and the reference router in front of them (``bench/soak_rig.py``). This
   process becomes a child subreaper, so the engines' orphans are its own to reap.
2. Draw the drains' kinds from a seeded generator (printed): rounds over every kind
   (``bench/soak_kinds.py``), each round in a shuffled order, so any run of at least as many
   drains as there are kinds covers them all.
3. Each pod runs its drains one after another; up to ``--parallel`` pods (default: all but
   one, so one always serves) drain at once. The router restart runs alone (no load may
   start while the router is down). The coordinator restart runs on the last pod only, so
   the other coordinators live through the whole run.
4. One drain: a fresh streaming load through the router (every token checked against
   ``expected_tokens``); once it flows, the kind drains the pod its way; the load ends.
5. Check it from outside the coordinator (``bench/soak_truth.py``): streams lost (allowed
   only while a force or crash drain ran: nothing hands their requests back first), tokens
   missing or duplicated, processes of the engine (ready file, end records, daemons, the
   pod's cgroup) still running, and the summary held against each process's own record and
   the exit codes its parent, or this process, saw.
6. Start a fresh engine on the same port with the next kind's knobs; it registers with the
   same coordinator, which serves again. Sample every long-lived coordinator's RSS and open
   fds.
7. Stop starting drains after ``--drains`` or ``--max-seconds`` (or SIGTERM, Ctrl-C); print
   the table and end every process started, by PID (the kill engine, SIGKILL as the
   fallback), also when stopped.

Exit status 0 only when no request was lost where none may be, no token was missing or
duplicated, no process was left, no summary was untrue, no step failed, every kind ran
(when at least as many drains as kinds were asked for), and the coordinators' RSS and fd
counts are flat: the mean of the last 10 % of samples at most 1.25 x the first 10 %'s,
plus 8 MiB (RSS) or 8 (fds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx

from bench.soak_kinds import KINDS, Cycle, Kind
from bench.soak_report import Resources, report
from bench.soak_result import DrainResult
from bench.soak_rig import Fleet, RigError, SoakPod, become_subreaper, registered, wait_status
from bench.soak_schedule import Schedule, Slots
from bench.soak_truth import (
    check_summary,
    endings,
    engine_pids,
    processes_left,
    registered_ending,
    running_as,
)
from devstack.sim.launcher import PopenLike
from devstack.sim.linux import wait_for_exits
from devstack.streaming_load import StreamingLoad

LOAD_TIMEOUT_S = 120.0
CYCLE_TIMEOUT_S = 180.0
FLOWING_TIMEOUT_S = 60.0
KEEPALIVE_S = 1.0


class Soak:
    def __init__(self, args: argparse.Namespace, fleet: Fleet, http: httpx.AsyncClient,
                 kinds: list[Kind]) -> None:
        self.args = args
        self.fleet = fleet
        self.http = http
        self.created = time.monotonic()
        self.began = self.created
        """When the first drain could start (the fleet was up)."""
        self.deadline = self.created + args.max_seconds
        """``--max-seconds`` counts from before the fleet starts: it bounds the whole run."""
        self.schedule = Schedule(kinds, random.Random(args.seed), args.drains, self.deadline,
                                 restart_pod=args.pods - 1)
        self.slots = Slots(args.parallel)
        self.numbers = itertools.count(1)
        self.results: list[DrainResult] = []
        self.resources = Resources()
        self.router_stats: list[dict[str, Any]] = []
        self.fatal: list[str] = []
        self.lossy: list[list[float]] = []
        """[start, end] of each force or crash drain (end: inf while it runs)."""
        self.stopped_by: signal.Signals | None = None

    # -- the pods' loops ------------------------------------------------------------------

    async def run(self, first: list[Kind | None]) -> None:
        await asyncio.gather(*(self.pod_loop(pod, kind)
                               for pod, kind in zip(self.fleet.pods, first, strict=True)))

    async def pod_loop(self, pod: SoakPod, kind: Kind | None) -> None:
        while kind is not None and not self.fatal:
            async with self.slots.hold(kind.exclusive):
                if time.monotonic() >= self.deadline or self.fatal:
                    return
                result, finish = await self.drain(pod, kind)
                kind = self.schedule.reserve(pod.index)
                # The next engine comes up inside the slot (so the other pods keep serving)
                # while this drain's streams finish.
                up = await asyncio.gather(self.next_engine(pod, kind), finish,
                                          return_exceptions=True)
                result.seconds = time.monotonic() - result.started
                self.results.append(result)
                self.print_result(result)
                if isinstance(up[0], BaseException):
                    self.fatal.append(f"{pod.name}: the next engine: {up[0]}")
                    return
                self.resources.sample(self.fleet.pods)

    async def next_engine(self, pod: SoakPod, kind: Kind | None) -> None:
        knobs = kind.knobs if kind is not None else {}
        engine = await asyncio.to_thread(self.fleet.start_engine, pod, knobs)
        await wait_status(self.http, pod.coordinator.url, registered(engine.pid),
                          f"{pod.name}'s engine {engine.pid} registered")
        await self.router_routes_to(engine.url)

    async def router_routes_to(self, engine_url: str) -> None:
        """Until the router has seen the pod serve again (its load may land there)."""
        for _ in range(int(FLOWING_TIMEOUT_S / 0.05)):
            workers = (await self.http.get(f"{self.fleet.router_url}/workers")).json()
            if any(w["url"] == engine_url and not w["draining"] for w in workers):
                return
            await asyncio.sleep(0.05)
        raise RigError(f"the router never routed to {engine_url} again")

    # -- one drain ------------------------------------------------------------------------

    async def drain(self, pod: SoakPod, kind: Kind,
                    ) -> tuple[DrainResult, Coroutine[Any, Any, None]]:
        """One drain of ``pod`` under a fresh load, checked against the truth; returns the
        result and what finishes it once the load's streams end."""
        number = next(self.numbers)
        engine = pod.current_engine()
        result = DrainResult(number, pod.name, kind.name)
        load = StreamingLoad(
            self.fleet.router_url,
            [f"soak {number} stream {i}: once upon a time" for i in range(self.args.streams)],
            self.args.max_tokens, request_id_prefix=f"soak{number}-", timeout_s=LOAD_TIMEOUT_S)
        load_began = time.monotonic()
        clients = asyncio.create_task(load.run())
        c = Cycle(self.fleet, pod, engine, number, self.http, errors=result.errors)
        summary: dict[str, Any] | None = None
        window = [time.monotonic(), float("inf")]
        try:
            await asyncio.wait_for(load.flowing.wait(), FLOWING_TIMEOUT_S)
            result.mark("flowing")
            if kind.may_lose:
                window[0] = time.monotonic()
                self.lossy.append(window)
            summary = await asyncio.wait_for(kind.run(c), CYCLE_TIMEOUT_S)
            result.outcome = summary.get("outcome")
        except Exception as exc:  # a finding of this drain; the soak goes on
            c.errors.append(f"{type(exc).__name__}: {exc}")
            await self.recover(pod)
        finally:
            window[1] = time.monotonic()
        result.mark("drained")
        self.router_stats += c.router_stats
        main_code = c.main_code
        if main_code is None:
            main_code = await asyncio.to_thread(wait_status_of, engine.proc, 60.0)
            if main_code is None:
                c.errors.append("the engine's main process still ran 60 s after the drain")
        extra = {pid: await asyncio.to_thread(wait_status_of, proc, 10.0)
                 for pid, proc in c.extra.items()}
        pids = engine_pids(engine, pod.start_ticks)
        reaped: dict[int, int] = {}
        left = await asyncio.to_thread(processes_left, {**pids, **dict.fromkeys(extra)},
                                       pod.unit, {engine.pid, *extra}, reaped)
        result.left = left + [f"{pid} (registered by the soak; SIGKILLed 10 s after the drain)"
                              for pid, code in extra.items() if code is None]
        if result.left:
            await self.end_leftovers(pod, pids)
        truth = endings(engine, pids, main_code, reaped, kind.mode)
        truth.update({pid: registered_ending(pid, code) for pid, code in extra.items()})
        result.mark("checked")

        async def finish() -> None:
            streams = await clients
            result.tally(streams, loss_allowed=self.lossy_during(load_began, time.monotonic()))
            if summary is not None:
                result.untruthful = check_summary(summary, truth, mode=kind.mode,
                                                  clients_done=result.lost == 0)
            if result.outcome != kind.outcome:
                result.unexpected = True
            if result.findings():
                self.keep_evidence(result, summary)
            else:
                shutil.rmtree(engine.record_dir, ignore_errors=True)
            result.mark("streams done")

        return result, finish()

    def lossy_during(self, began: float, ended: float) -> bool:
        """Whether a force or crash drain ran at some time between ``began`` and ``ended``."""
        return any(start < ended and end > began for start, end in self.lossy)

    def keep_evidence(self, result: DrainResult, summary: dict[str, Any] | None) -> None:
        """The summary of a drain with findings, next to its engine's records."""
        path = self.fleet.workdir / "findings" / f"{result.number:05d}-{result.kind}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"result": dataclasses.asdict(result), "summary": summary},
                                   indent=1))

    async def recover(self, pod: SoakPod) -> None:
        """After a failed step: finish the pod's drain (force) so the soak can go on."""
        with contextlib.suppress(httpx.HTTPError):
            await self.http.post(f"{pod.coordinator.url}/drain",
                                 json={"force": True, "reason": "soak: recovering"},
                                 timeout=CYCLE_TIMEOUT_S)

    async def end_leftovers(self, pod: SoakPod, pids: dict[int, int | None]) -> None:
        """SIGKILL what a drain left of the engine (counted already), by PID."""
        alive = [pid for pid, ticks in pids.items() if running_as(pid, ticks)]
        alive += [pid for pid in pod.unit.members() if pid not in pids]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(wait_for_exits, alive, 10.0)

    def print_result(self, result: DrainResult) -> None:
        if not self.args.quiet or result.left or result.untruthful or result.errors:
            print(result.line(), file=sys.stderr, flush=True)
        for what, lines in (("left", result.left), ("untrue", result.untruthful),
                            ("error", result.errors)):
            for line in lines:
                print(f"        {what}: {line}", file=sys.stderr, flush=True)


def wait_status_of(proc: PopenLike, timeout_s: float = 10.0) -> int | None:
    """``proc``'s wait status once the drain ended it; None (and SIGKILLed) if it did not."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


# --- the run --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--drains", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None, help="default: drawn and printed")
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=None,
                        help="pods draining at once (default: pods - 1)")
    parser.add_argument("--streams", type=int, default=6, help="client streams per drain")
    parser.add_argument("--max-tokens", type=int, default=30, help="tokens per stream")
    parser.add_argument("--max-seconds", type=float, default=float("inf"),
                        help="start no drain after this long")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma list of kinds (default all: {','.join(KINDS)})")
    parser.add_argument("--unit", choices=("auto", "cgroup", "mntns"), default="auto",
                        help="what holds each engine, as a container would")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--quiet", action="store_true", help="print only drains with findings")
    args = parser.parse_args(argv)
    args.seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    args.parallel = args.parallel or max(1, args.pods - 1)
    if args.pods < 2 or args.drains < 1 or not 1 <= args.parallel < args.pods:
        parser.error("--pods must be >= 2, --drains >= 1, 1 <= --parallel < --pods")
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}")
    return args


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    kinds = [KINDS[name] for name in args.kinds.split(",")]
    fleet = Fleet(workdir, args.pods, args.unit)
    # Idle connections are dropped well before the coordinators' keep-alive timeout (5 s):
    # a request sent on one the server is closing at that moment would fail unanswered.
    limits = httpx.Limits(max_connections=256, keepalive_expiry=KEEPALIVE_S)
    try:
        async with httpx.AsyncClient(headers=fleet.headers, timeout=30.0,
                                     limits=limits) as http:
            soak_run = Soak(args, fleet, http, kinds)
            stop_on_signals(soak_run)
            first = [soak_run.schedule.reserve(i) for i in range(args.pods)]
            await asyncio.to_thread(fleet.start, [k.knobs if k else {} for k in first])
            for pod in fleet.pods:
                await wait_status(http, pod.coordinator.url,
                                  registered(pod.current_engine().pid), f"{pod.name} up")
            print(f"{args.pods} pods up (units: {fleet.pods[0].unit.kind}), router at "
                  f"{fleet.router_url}; draining ...", file=sys.stderr, flush=True)
            soak_run.began = time.monotonic()
            await soak_run.run(first)
            with contextlib.suppress(httpx.HTTPError):
                soak_run.router_stats.append(
                    (await http.get(f"{fleet.router_url}/stats")).json())
            for pod in fleet.pods:
                soak_run.resources.note_cpu("coordinators", pod.coordinator.proc.pid)
            if fleet.stack.router is not None:
                soak_run.resources.note_cpu("the router", fleet.stack.router.pid)
            code = report(args, soak_run, kinds)
            if soak_run.stopped_by:
                print(f"stopped early by {soak_run.stopped_by.name}", file=sys.stderr)
                return 128 + soak_run.stopped_by
            return code
    finally:
        await fleet.close()


def stop_on_signals(soak_run: Soak) -> None:
    """SIGTERM or SIGINT: start no new drain, finish those running, report, end everything.
    A second one: stop at once (every process is still ended)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def stop(signum: signal.Signals) -> None:
        if soak_run.stopped_by is not None and task is not None:
            task.cancel()
            return
        soak_run.stopped_by = signum
        soak_run.deadline = soak_run.schedule.deadline = time.monotonic()
        print(f"{signum.name}: finishing the drains under way (again: stop now)",
              file=sys.stderr, flush=True)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"chaos soak: --drains {args.drains} --seed {args.seed} --pods {args.pods} "
          f"--parallel {args.parallel} --max-seconds {args.max_seconds:g}", flush=True)
    become_subreaper()
    workdir = Path(tempfile.mkdtemp(prefix="shutdown-coordinator-soak-"))
    code = 1
    try:
        code = asyncio.run(soak(args, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("stopped: every process the soak started was ended", file=sys.stderr)
        code = 130
    finally:
        if args.keep or code != 0:
            print(f"logs and records kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
