"""One drain of a simulated multi-node group under streaming load, for ``bench/group.py``.

The group is tests/group's (``tests/group/rig.py``: a coordinator per pod, real processes on
loopback addresses, the simulated multi-node engine registered with them): a leader pod (HTTP
front end, rank 0) and followers (their ranks), the reference router over the leader's front
end with a spare engine of its own pod as the standby where handed-back streams continue.
Two ways to drain it:

- ``per-pod``: the coordinators know no group (no ``--group-*`` flags, no LWS environment):
  each drains only its own pod, as before issue 14;
- ``group``: the same coordinators configured as a group (``--group-size``,
  ``--group-index``, ``--group-leader``): the leader's coordinator owns the drain.

Every other setting is the same (``GROUP_FAST``: the tests' budgets). Two scenarios:

- ``deletion``: every pod's preStop hook called at once, as a group deletion runs them;
- ``eviction``: one follower's hook alone (``EVICTED``), as a node drain evicts the pod on
  it; the group cannot serve without it (docs/group.md: LWS's default restart policy then
  recreates the whole group anyway).

Every process is
started through a ``ProcessJanitor`` and ended by it (SIGTERM, then SIGKILL); the group's
pods, if any is left, are SIGKILLed first.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench.group_truth import (
    PodTruth,
    Proc,
    RunResult,
    lost,
    process_ends,
    time_to_empty,
    tokens_damage,
)
from devstack.sim.group.launcher import GroupHandle
from devstack.sim.group.launcher import Pod as GroupPod
from devstack.sim.records import read_records
from tests.group.rig import (
    GROUP_FAST,
    WAIT_S,
    Coordinators,
    drain_all,
    start_coordinators,
    start_sim,
    wait_announced,
)
from tests.migration.stack import Load, Pod, start_pod, start_router
from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

PER_POD = "per-pod"
GROUP = "group"
WAYS = (PER_POD, GROUP)
DELETION = "deletion"
EVICTION = "eviction"
SCENARIOS = (DELETION, EVICTION)
POLL_S = 0.01
"""How often the bench looks for the pods' processes (the resolution of time to empty)."""


@dataclass(frozen=True)
class Params:
    """The group and its load. Streams are long enough (``max_tokens`` times the token
    interval, 2 s by default) that every stream is still being stepped when the hooks are called."""

    size: int = 4
    """A leader and 3 followers, as tests/group."""
    ranks_per_pod: int = 1
    streams: int = 16
    max_tokens: int = 100
    token_interval_ms: float = 20.0
    warm_tokens: int = 5
    """The hooks are called once every stream has this many tokens."""
    collective_timeout_s: float = 5.0
    """How long a rank hangs in a broken step before it aborts (tests/group's; torch's
    default is 10 minutes, which would only lengthen the per-pod way's time to empty)."""
    repetitions: int = 4
    scenarios: tuple[str, ...] = SCENARIOS
    empty_bound_s: float = 120.0
    """A run whose group has not emptied by then counts as not emptied (its pods are then
    SIGKILLed)."""


QUICK = Params(streams=8, max_tokens=60, repetitions=1)


class EmptyWatch:
    """When each process of every pod ended, seen by polling: gone, or a zombie (its exit
    status decided, its parent not yet reaping it). The pods' main processes are the bench's
    children and are left unreaped here: their coordinators read a zombie's exit status
    (the kubelet's place in a real pod), and the bench reaps them once the hooks answered."""

    def __init__(self, group: GroupHandle) -> None:
        # Taken before the drain: psutil keeps each process's start time, so a PID reused
        # later is not mistaken for it.
        self.procs: dict[int, psutil.Process | None] = {}
        for pod in group.pods:
            for pid in pod.pids():
                try:
                    self.procs[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    self.procs[pid] = None
        self.stop = threading.Event()

    def wait(self, bound_s: float) -> dict[int, float | None]:
        """``time.monotonic()`` when each process was first seen ended (None: not within
        ``bound_s``, or the watch was stopped)."""
        ended: dict[int, float | None] = dict.fromkeys(self.procs)
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline and not self.stop.is_set():
            now = time.monotonic()
            for pid, proc in self.procs.items():
                if ended[pid] is None and not _running(proc):
                    ended[pid] = now
            if all(at is not None for at in ended.values()):
                break
            time.sleep(POLL_S)
        return ended


def _running(proc: psutil.Process | None) -> bool:
    if proc is None:
        return False
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pod_truth(pod: GroupPod) -> PodTruth:
    """What a pod left: its main's wait status, its processes, its records."""
    return PodTruth(
        index=pod.node_rank, main_pid=pod.pid, main_code=pod.engine.proc.poll(),
        processes=tuple(Proc(p.pid, p.role, p.rank) for p in pod.engine.processes),
        records=tuple(read_records(pod.engine.record_dir)))


def start_coordinators_for(way: str, janitor: ProcessJanitor, tmp: Path,
                           size: int) -> Coordinators:
    """A coordinator per pod, the leader's first: a group's (tests/group/rig.py's, announced
    to the leader) or ones that know no group, with the same budgets."""
    if way == GROUP:
        coordinators = start_coordinators(janitor, tmp, size, token=None)
        wait_announced(coordinators)
        return coordinators
    return Coordinators([start_coordinator(janitor, tmp, *GROUP_FAST, name=f"coordinator-{i}")
                         for i in range(size)], "")


def evicted(size: int) -> int:
    """The follower whose pod the eviction scenario drains alone: a middle one, neither the
    leader nor (in a group of 4) the last to have joined."""
    return min(2, size - 1)


async def run_once(way: str, scenario: str, params: Params, tmp: Path,
                   janitor: ProcessJanitor | None = None) -> RunResult:
    """One drain of one group, every process ended afterwards whatever happened (by
    ``janitor``'s owner when one is given: a test's fixture, which fails on a leak)."""
    own = janitor is None
    janitor = janitor or ProcessJanitor()
    groups: list[GroupHandle] = []
    try:
        return await _run(janitor, groups, way, scenario, params, tmp)
    finally:
        for group in groups:
            try:
                group.kill()  # only what is still running: after a run, nothing should be
            finally:
                group.close()
        if own:
            janitor.close()
            for problem in janitor.problems:  # a leak, or a service that needed SIGKILL
                print(f"{scenario} {way}: janitor: {problem}", file=sys.stderr)


async def _run(janitor: ProcessJanitor, groups: list[GroupHandle], way: str, scenario: str,
               params: Params, tmp: Path) -> RunResult:
    """1. A coordinator per pod (the way's), the group registered with them, the spare
    engine (its own coordinator), the router over the leader's front end with the spare as
    its standby. 2. ``streams`` streams through the router, until each has ``warm_tokens``.
    3. The scenario's preStop hooks (``drain_all``: ``GET /drain`` on each at once): every
    coordinator's, or the evicted follower's alone; the watch on every process of every pod
    starts at the same moment.
    4. Once every process ended (or the bound passed) and every stream ended: the counts."""
    tmp.mkdir(parents=True)  # noqa: ASYNC240 (before anything runs)
    coordinators = start_coordinators_for(way, janitor, tmp, params.size)
    group = start_sim(janitor, tmp, groups, coordinators, schedulers=params.ranks_per_pod,
                      token_interval_ms=params.token_interval_ms,
                      collective_timeout_s=params.collective_timeout_s)
    spare = start_pod(janitor, tmp, "spare", token_interval_ms=params.token_interval_ms)
    janitor.service(spare.engine.proc, exit_code=0)  # scenery: stopped at the end
    router = start_router(janitor, tmp, [Pod(group.leader.engine, coordinators.leader)],
                          "--standby-worker", f"{spare.engine.url}={spare.coordinator_url}")
    watch = EmptyWatch(group)

    load = Load(router, params.streams, params.max_tokens, params.warm_tokens)
    clients = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), WAIT_S)
    t0 = time.monotonic()
    emptied = asyncio.create_task(asyncio.to_thread(watch.wait, params.empty_bound_s))
    try:
        hooked = coordinators.all if scenario == DELETION else \
            [coordinators.all[evicted(params.size)]]
        answers = await drain_all([c.url for c in hooked], token=None)
        hooks_s = time.monotonic() - t0
        ended_at = await emptied
        streams = await asyncio.wait_for(clients, WAIT_S)
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            router_stats = (await http.get(f"{router}/stats")).raise_for_status().json()
    finally:
        watch.stop.set()  # a failed hook must not leave the watch running
    missing, duplicated = tokens_damage(streams)
    return RunResult(
        way=way, scenario=scenario, streams=len(streams), lost=len(lost(streams)),
        tokens_missing=missing, tokens_duplicated=duplicated,
        broken=int(router_stats["broken"]),
        ends=[e for pod in group.pods for e in process_ends(pod_truth(pod))],
        empty_s=time_to_empty(t0, ended_at), hooks_s=hooks_s,
        verdicts=[str(a.get("outcome")) for a in answers])
