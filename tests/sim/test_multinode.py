"""The simulated multi-node engine: a leader pod and follower pods whose ranks step together.

Real processes in pods of their own (a session each; a network namespace each where the
machine allows it, else a loopback address each), real sockets between the ranks, real
signals. What happened is read from each process's exit status and its own record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.sim import expected_tokens
from devstack.sim.errors import SimStartupError
from devstack.sim.group.launcher import (
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
    GroupHandle,
    GroupShape,
    launch_pod,
    spawn_beside,
    start_group,
)
from devstack.sim.group.network import KIND_AUTO, KIND_LOOPBACK, KIND_NETNS, make_network
from devstack.sim.group.pod import EXIT_GROUP_BROKEN
from devstack.sim.group.protocol import CAUSE_FINISHED, CAUSE_LEFT, CAUSE_TIMED_OUT
from devstack.sim.records import read_records
from devstack.sim.roles import EXIT_STARTUP_FAILED
from tests.sim.support import assert_nothing_left, read_events
from tests.support.processes import ProcessJanitor

StartGroup = Callable[..., GroupHandle]
EXIT_TIMEOUT_S = 60.0
"""Bounds a failing test only: each wait below is for an event."""
WORLD = 4
"""A leader and 3 followers, one rank each."""
SHORT_TIMEOUT_S = 2.0
"""The collective timeout of tests that break the group: how long the others hang before
they abort. Short, so the test is; long enough that a healthy step on a loaded 2-core
machine never reaches it."""


@pytest.fixture
def start_sim_group(janitor: ProcessJanitor, tmp_path: Path) -> Iterator[StartGroup]:
    """Start a group (a leader and 3 followers, one rank each, unless told otherwise).

    At the end every pod still running is SIGKILLed (its ranks die with it: PDEATHSIG) and
    reaped, then the group's network namespaces are deleted; the janitor checks that
    nothing is left."""
    counter = itertools.count()
    groups: list[GroupHandle] = []

    def start(size: int = WORLD, **knobs: Any) -> GroupHandle:
        knobs.setdefault("schedulers", 1)
        knobs.setdefault("token_interval_ms", 2)
        group = start_group(janitor.spawn, tmp_path / f"group-{next(counter)}", size, **knobs)
        groups.append(group)
        return group

    yield start
    for group in groups:
        try:
            group.kill()
        finally:
            group.close()


async def _stream(
    client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
    on_token: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[list[str], dict[str, Any] | str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        return await read_events(response, on_token)


async def _exit_codes(group: GroupHandle) -> list[int]:
    """Wait for every pod's main process to exit; their exit codes, the leader's first."""
    return [await asyncio.to_thread(pod.engine.proc.wait, EXIT_TIMEOUT_S) for pod in group.pods]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.parametrize(("size", "ranks", "network"), [
    (WORLD, 1, KIND_AUTO),
    (2, 2, KIND_LOOPBACK),
], ids=["4-pods-auto", "2-pods-2-ranks-loopback"])
async def test_a_group_serves_streams_each_token_a_step_of_every_rank(
    start_sim_group: StartGroup, size: int, ranks: int, network: str,
) -> None:
    """1. Start a group: a leader and 3 followers with a rank each on namespaces where the
    machine has them, or 2 pods with 2 ranks each on loopback addresses. 2. Each pod is a
    session of its own with the LeaderWorkerSet environment and an address of its own (a
    network namespace of its own where it has one), its ranks in its tree. 3. Three streams
    at once through the leader yield exactly their expected tokens. 4. The leader stepped the
    group at least once per token. 5. Finishing the group (what a group drain does) has
    every other rank answer bye; each follower pod then exits 0 on its own, and the leader
    exits 0 on SIGTERM. 6. Every rank finished with exit 0 after the same number of steps,
    the stepper's; nothing is left running."""
    world = size * ranks
    group = start_sim_group(size, schedulers=ranks, network=network, graceful_main=True)
    assert [pod.node_rank for pod in group.pods] == list(range(size))
    assert group.ranks().keys() == set(range(world))
    assert len({pod.address for pod in group.pods}) == size
    for pod in group.pods:
        env = _environ(pod.pid)
        assert (env[LWS_LEADER_ADDRESS], env[LWS_GROUP_SIZE], env[LWS_WORKER_INDEX]) == (
            group.leader.address, str(size), str(pod.node_rank))
        assert all(os.getsid(pid) == pod.pid for pid in pod.pids())
        first = pod.node_rank * ranks
        assert pod.rank_pids().keys() == set(range(first, first + ranks))
    if group.network.kind == KIND_NETNS:
        namespaces = [{os.readlink(f"/proc/{pid}/ns/net") for pid in pod.pids()}
                      for pod in group.pods]
        assert all(len(ns) == 1 for ns in namespaces)
        assert len(set.union(*namespaces)) == size

    prompts = {f"prompt {i}:": 8 + 8 * i for i in range(3)}
    async with httpx.AsyncClient(timeout=EXIT_TIMEOUT_S) as client:
        streamed = await asyncio.gather(
            *(_stream(client, group.url, p, n) for p, n in prompts.items()))
        for (prompt, n), (tokens, last) in zip(prompts.items(), streamed, strict=True):
            assert (tokens, last) == (expected_tokens(prompt, n), "[DONE]")
        status = (await client.get(f"{group.url}/internal/group")).json()
        assert (status["state"], status["world_size"]) == ("stepping", world)
        assert status["steps"] >= max(prompts.values())
        finished = (await client.post(f"{group.url}/internal/group/finish")).json()
    assert finished["state"] == "finished"
    assert finished["finish"] == {str(rank): "bye" for rank in range(1, world)}

    followers = [await asyncio.to_thread(pod.engine.proc.wait, EXIT_TIMEOUT_S)
                 for pod in group.followers]
    assert followers == [0] * (size - 1)
    os.kill(group.leader.pid, signal.SIGTERM)
    assert await _exit_codes(group) == [0] * size
    for rank, record in group.rank_records().items():
        assert (record["exit_code"], record["cause"], record["cleanup"]) == (
            0, CAUSE_FINISHED, "finished"), rank
        assert record["steps"] == finished["steps"], rank
        assert record["hung"] is None
    assert_nothing_left(group)


def test_a_sidecar_beside_a_pod_shares_its_network_and_environment(
    start_sim_group: StartGroup, janitor: ProcessJanitor,
) -> None:
    """1. Start a group of 3 pods. 2. Start a process beside pod 2, as its coordinator
    sidecar would run: it listens on the pod's address. 3. It is in the pod's network
    namespace (where pods have one) and has the pod's LeaderWorkerSet environment. 4. The
    host reaches it at the pod's address; it answers its LWS_WORKER_INDEX and exits 0."""
    group = start_sim_group(3)
    pod = group.pods[2]
    serve_once = ("import os, socket, sys; s = socket.create_server((sys.argv[1], 0)); "
                  "print(s.getsockname()[1], flush=True); c, _ = s.accept(); "
                  "c.sendall(os.environ['LWS_WORKER_INDEX'].encode()); c.close()")
    sidecar = spawn_beside(janitor.spawn, group.network, 2,
                           [sys.executable, "-c", serve_once, pod.address],
                           stdout=subprocess.PIPE, text=True)
    assert sidecar.stdout is not None
    port = int(sidecar.stdout.readline())
    assert os.readlink(f"/proc/{sidecar.pid}/ns/net") == os.readlink(f"/proc/{pod.pid}/ns/net")
    lws = (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX)
    beside, engine = _environ(sidecar.pid), _environ(pod.pid)
    assert [beside[k] for k in lws] == [engine[k] for k in lws] == [
        group.leader.address, "3", "2"]
    with socket.create_connection((pod.address, port), timeout=EXIT_TIMEOUT_S) as conn:
        assert conn.recv(16) == b"2"
    assert sidecar.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_a_group_missing_a_pod_never_comes_up_and_says_who_is_missing(
    janitor: ProcessJanitor, tmp_path: Path,
) -> None:
    """1. Start pods 0 to 2 of a group of 4, with a 5 s startup bound; pod 3 never comes.
    2. No pod comes up: rank 0 gives up waiting, and the others with it. 3. Every pod's
    main process exits EXIT_STARTUP_FAILED, and rank 0's record names rank 3."""
    network = make_network(WORLD)
    try:
        shape = GroupShape.on(network, WORLD)
        launches = [launch_pod(janitor.spawn, tmp_path / f"pod-{place.index}", place, shape,
                               schedulers=1, startup_timeout_s=5.0)
                    for place in network.pods[:3]]
        with pytest.raises(SimStartupError, match="exited with 2"):
            launches[0].wait_ready()
        codes = [launch.launch.proc.wait(timeout=EXIT_TIMEOUT_S) for launch in launches]
        assert codes == [EXIT_STARTUP_FAILED] * 3
        (rank_zero,) = [r for r in read_records(tmp_path / "pod-0") if r["rank"] == 0]
        assert rank_zero["exit_code"] == EXIT_STARTUP_FAILED
        assert "ranks [3] did not join" in rank_zero["detail"]
    finally:
        network.close()


@pytest.mark.parametrize("rank0_finishes", [True, False],
                         ids=["rank0-sigterm-finishes", "rank0-sigterm-leaves"])
async def test_sigterm_to_the_leader_stops_the_group_in_a_safe_order(
    start_sim_group: StartGroup, rank0_finishes: bool,
) -> None:
    """1. Start a group whose leader stops gracefully (its rank 0 finishing the group on its
    own SIGTERM, or, as an SGLang scheduler, just leaving). 2. Mid-stream, SIGTERM the
    leader's main process. 3. The stream is handed back with a correct prefix. 4. The
    leader hands back, has rank 0 finish the group (as SGLang's tokenizer sends
    ShutdownReq), then stops what is left: every pod's main process exits 0, every rank
    finished its cleanup with exit 0 after the same steps, rank 0 heard every rank's bye.
    5. Nothing is left in /proc or in the pods' namespaces."""
    group = start_sim_group(graceful_main=True, teardown_s=0.1,
                            rank0_sigterm_finishes=rank0_finishes)
    async with httpx.AsyncClient(timeout=EXIT_TIMEOUT_S) as client:

        async def stop_after_three(n: int) -> None:
            if n == 3:
                os.kill(group.leader.pid, signal.SIGTERM)

        tokens, last = await _stream(client, group.url, "p", 100_000, stop_after_three)
    assert isinstance(last, dict)
    assert (last["handed_back"], last["tokens"]) == (True, len(tokens))
    assert tokens == expected_tokens("p", len(tokens))

    assert await _exit_codes(group) == [0] * WORLD
    records = group.rank_records()
    assert records.keys() == {0, 1, 2, 3}
    assert records[0]["finish"] == {"1": "bye", "2": "bye", "3": "bye"}
    assert len({record["steps"] for record in records.values()}) == 1
    for rank, record in records.items():
        assert (record["exit_code"], record["cause"], record["cleanup"]) == (
            0, CAUSE_FINISHED, "finished"), rank
    leader = group.leader.engine.record_of(group.leader.pid)
    assert leader is not None
    assert leader["group"]["finish"] == records[0]["finish"]
    assert_nothing_left(group)


async def test_a_rank_zero_that_leaves_on_sigterm_breaks_the_group(
    start_sim_group: StartGroup,
) -> None:
    """1. Start a group whose rank 0 leaves on SIGTERM, as an SGLang scheduler does.
    2. SIGTERM rank 0 (a drain that stops the leader pod's children first). 3. Rank 0
    leaves and exits 0; the leader's watchdog takes its front end down (-9). 4. Every other
    rank loses rank 0, hangs, and aborts ("collective timed out", waiting for rank 0); the
    followers exit EXIT_GROUP_BROKEN."""
    group = start_sim_group(collective_timeout_s=SHORT_TIMEOUT_S, rank0_sigterm_finishes=False)
    os.kill(group.ranks()[0], signal.SIGTERM)
    assert await _exit_codes(group) == [-signal.SIGKILL] + [EXIT_GROUP_BROKEN] * (WORLD - 1)
    records = group.rank_records()
    assert (records[0]["exit_code"], records[0]["cause"]) == (0, CAUSE_LEFT)
    for rank in (1, 2, 3):
        assert (records[rank]["exit_code"], records[rank]["cause"]) == (
            -signal.SIGABRT, CAUSE_TIMED_OUT), rank
        assert records[rank]["hung"]["waiting_for"] == [0]
    assert_nothing_left(group)


@pytest.mark.parametrize(("victim", "signum"), [
    ("rank", signal.SIGKILL), ("rank", signal.SIGTERM), ("main", signal.SIGTERM),
], ids=["sigkill-rank", "sigterm-rank", "sigterm-main-vllm-like"])
async def test_a_follower_rank_gone_mid_stream_makes_the_others_hang_then_crash(
    start_sim_group: StartGroup, victim: str, signum: int,
) -> None:
    """1. Start a group with a short collective timeout (the leader stock, as SGLang is,
    or, with --graceful-main, followers that pass SIGTERM on to their ranks, as vLLM's
    headless nodes do). 2. Mid-stream, end rank 2: SIGKILL it, SIGTERM it (as a per-pod
    drain would: it leaves the group and exits 0 itself), or SIGTERM its pod's main process.
    3. The stream is cut, never completed nor handed back. 4. The next step cannot complete:
    ranks 0, 1 and 3 hang, then abort (SIGABRT) with "collective timed out", rank 0 naming
    rank 2 as the one it waited for. 5. The leader's watchdog takes the front end down with
    rank 0 (-9); the other followers exit EXIT_GROUP_BROKEN; rank 2's pod exits 0 only if
    rank 2 itself did."""
    group = start_sim_group(collective_timeout_s=SHORT_TIMEOUT_S, graceful_main=victim == "main")
    target = group.ranks()[2] if victim == "rank" else group.pods[2].pid
    cut: BaseException | None = None
    tokens: list[str] = []
    last: dict[str, Any] | str = ""
    async with httpx.AsyncClient(timeout=EXIT_TIMEOUT_S) as client:

        async def end_rank_two(n: int) -> None:
            if n == 5:
                os.kill(target, signum)

        try:
            tokens, last = await _stream(client, group.url, "q", 100_000, end_rank_two)
        except httpx.TransportError as exc:
            cut = exc
    assert cut is not None or (len(tokens) < 100_000 and last == "")

    codes = await _exit_codes(group)
    left = signum == signal.SIGTERM
    assert codes == [-signal.SIGKILL, EXIT_GROUP_BROKEN, 0 if left else EXIT_GROUP_BROKEN,
                     EXIT_GROUP_BROKEN]
    records = group.rank_records()
    for rank in (0, 1, 3):
        record = records[rank]
        assert (record["exit_code"], record["cause"]) == (-signal.SIGABRT, CAUSE_TIMED_OUT), rank
        assert record["cleanup"] == "interrupted"
        assert record["hung"]["step"] == records[0]["hung"]["step"]
    assert records[0]["hung"]["waiting_for"] == [2]
    assert "rank 2" in records[0]["hung"]["why"]
    assert records[0]["peers_lost"] == {"2": "closed its connection"}
    if left:
        assert (records[2]["exit_code"], records[2]["cause"]) == (0, CAUSE_LEFT)
    else:
        assert records[2]["ended_at"] is None
    leader = group.leader.engine.record_of(group.leader.pid)
    assert leader is not None
    assert leader["detail"].startswith("watchdog: scheduler")
    assert_nothing_left(group)


async def test_a_follower_rank_that_stops_answering_makes_the_others_time_out(
    start_sim_group: StartGroup,
) -> None:
    """1. Start a group with a short collective timeout. 2. Mid-stream, SIGSTOP rank 3: it
    holds its connection open and says nothing. 3. Ranks 0, 1 and 2 hang in the step and
    abort with "collective timed out", rank 0 waiting for rank 3 with no answer (nothing
    closed: only the timeout tells). 4. SIGCONT rank 3: it finds rank 0 gone mid-step, hangs
    and aborts the same way; its pod exits EXIT_GROUP_BROKEN like the others."""
    group = start_sim_group(collective_timeout_s=SHORT_TIMEOUT_S)
    silent = group.ranks()[3]
    async with httpx.AsyncClient(timeout=EXIT_TIMEOUT_S) as client:

        async def stop_rank_three(n: int) -> None:
            if n == 5:
                os.kill(silent, signal.SIGSTOP)

        with contextlib.suppress(httpx.TransportError):
            await _stream(client, group.url, "s", 100_000, stop_rank_three)
    first = [await asyncio.to_thread(pod.engine.proc.wait, EXIT_TIMEOUT_S)
             for pod in group.pods[:3]]
    assert first == [-signal.SIGKILL, EXIT_GROUP_BROKEN, EXIT_GROUP_BROKEN]
    records = group.rank_records()
    assert records[0]["hung"]["waiting_for"] == [3]
    assert records[0]["hung"]["why"] == "no answer"
    assert "peers_lost" not in records[0]
    for rank in (0, 1, 2):
        assert (records[rank]["exit_code"], records[rank]["cause"]) == (
            -signal.SIGABRT, CAUSE_TIMED_OUT), rank

    os.kill(silent, signal.SIGCONT)
    assert await _exit_codes(group) == [-signal.SIGKILL] + [EXIT_GROUP_BROKEN] * 3
    record = group.rank_records()[3]
    assert (record["exit_code"], record["cause"]) == (-signal.SIGABRT, CAUSE_TIMED_OUT)
    assert record["hung"]["waiting_for"] == [0]
    assert_nothing_left(group)
