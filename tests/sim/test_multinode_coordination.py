"""The simulated multi-node engine next to coordinators: one per pod, as a LeaderWorkerSet
with a sidecar in each pod has. Every pod's main process and every rank registers with its
own pod's coordinator; a drain of one follower pod alone (today's per-pod drain) is clean for
that pod and breaks the group, which is what a group drain must prevent."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx

from devstack.sim.group.network import KIND_LOOPBACK
from devstack.sim.group.pod import EXIT_GROUP_BROKEN
from devstack.sim.group.protocol import CAUSE_LEFT, CAUSE_TIMED_OUT
from devstack.sim.group.rank import RANK_ROLE
from tests.service.servers import FAST, Running, start_coordinator
from tests.sim.support import assert_nothing_left, read_events
from tests.sim.test_multinode import (  # noqa: F401 (a fixture)
    EXIT_TIMEOUT_S,
    SHORT_TIMEOUT_S,
    WORLD,
    StartGroup,
    start_sim_group,
)
from tests.support.processes import ProcessJanitor, wait_for


def _registered(coordinator: Running, expected: set[tuple[int, str, str]]) -> None:
    """Wait until the coordinator lists these ``(pid, role, name)`` workers."""

    def listed() -> bool:
        workers = coordinator.status()["workers"]
        return {(w["pid"], w["role"], w["name"]) for w in workers} >= expected

    wait_for(listed, what=f"workers {expected} registered at {coordinator.url}")


async def test_a_drain_of_one_follower_pod_alone_is_clean_there_and_breaks_the_group(
    start_sim_group: StartGroup, janitor: ProcessJanitor, tmp_path: Path,  # noqa: F811
) -> None:
    """1. Start a coordinator per pod, then a group on loopback addresses whose pods
    register with them. 2. Each coordinator lists its pod's main process (role worker) and
    its rank (role rank, named rank-R). 3. While a stream runs through the leader, drain
    follower pod 2 through its own coordinator, as its preStop hook would. 4. That drain is
    graceful for its pod: its rank left the group on SIGTERM and exited 0, its main process
    exited 0. 5. The group did not survive it: the stream is cut, ranks 0, 1 and 3 hang and
    abort ("collective timed out"), the other pods exit non-zero."""
    coordinators = [start_coordinator(janitor, tmp_path, *FAST, name=f"coordinator-{i}")
                    for i in range(WORLD)]
    group = start_sim_group(network=KIND_LOOPBACK, collective_timeout_s=SHORT_TIMEOUT_S,
                            coordinators=[c.url for c in coordinators])
    assert group.network.kind == KIND_LOOPBACK
    for pod, coordinator in zip(group.pods, coordinators, strict=True):
        ((global_rank, rank_pid),) = pod.rank_pids().items()
        main_name = "sim-engine" if pod.node_rank == 0 else f"sim-node-{pod.node_rank}"
        await asyncio.to_thread(_registered, coordinator, {
            (pod.pid, "worker", main_name), (rank_pid, RANK_ROLE, f"rank-{global_rank}")})

    follower = group.pods[2]
    drained: dict[str, Any] = {}
    cut: BaseException | None = None
    async with httpx.AsyncClient(timeout=EXIT_TIMEOUT_S) as client:
        drain: asyncio.Task[httpx.Response] | None = None

        async def drain_pod_two(n: int) -> None:
            nonlocal drain
            if n == 3:
                drain = asyncio.create_task(client.post(
                    f"{coordinators[2].url}/drain", json={"wait": True, "reason": "per pod"}))

        try:
            await _stream(client, group.url, drain_pod_two)
        except httpx.TransportError as exc:
            cut = exc
        assert drain is not None
        drained = (await drain).json()
    assert cut is not None

    assert drained["outcome"] == "graceful", drained["drain"].get("causes")
    fates = {p["pid"]: (p["fate"], p["exit_code"]) for p in drained["processes"]}
    assert fates[follower.rank_pids()[2]] == ("exited", 0)
    assert fates[follower.pid][1] == 0
    codes = [await asyncio.to_thread(pod.engine.proc.wait, EXIT_TIMEOUT_S) for pod in group.pods]
    assert codes == [-signal.SIGKILL, EXIT_GROUP_BROKEN, 0, EXIT_GROUP_BROKEN]
    records = group.rank_records()
    assert (records[2]["exit_code"], records[2]["cause"]) == (0, CAUSE_LEFT)
    assert records[2]["drain_notice_at"] is not None
    for rank in (0, 1, 3):
        assert (records[rank]["exit_code"], records[rank]["cause"]) == (
            -signal.SIGABRT, CAUSE_TIMED_OUT), rank
    assert_nothing_left(group)


async def _stream(client: httpx.AsyncClient, url: str, on_token: Any) -> None:
    body = {"prompt": "r", "max_tokens": 100_000, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        await read_events(response, on_token)
