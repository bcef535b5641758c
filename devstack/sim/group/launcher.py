"""Start a simulated multi-node engine from tests, the demo and benchmarks: one pod, or a
whole group, and read what happened.

    group = start_group(janitor.spawn, tmp_path, size=4, schedulers=1, graceful_main=True)
    group.url                                  # the leader's HTTP front end
    group.pods[2].pid, group.pods[2].address   # a follower pod: its main process, its address
    group.ranks()                              # {global rank: pid}
    group.rank_records()                       # {global rank: its end record}
    group.kill(); group.close()                # SIGKILL what still runs; delete the network

    network = make_network(4)                  # or first the network, and a sidecar per pod:
    spawn_beside(janitor.spawn, network, i, ["python", "-m", "coordinator", "serve", ...])
    group = start_group(janitor.spawn, tmp_path, 4, network=network, coordinators=[...])

Each pod is started as ``start_engine`` starts an engine — ``python -m devstack.sim`` with
``--nnodes``, ``--node-rank`` and ``--dist-init-addr`` — in a session of its own (or as its
``spawn`` does), inside its network namespace when it has one, with the environment a
LeaderWorkerSet gives its pods: ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``,
``LWS_WORKER_INDEX`` (what a coordinator next to it learns its group from).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from devstack.sim.group.network import (
    KIND_AUTO,
    KIND_NETNS,
    GroupNetwork,
    PodPlace,
    free_port,
    make_network,
)
from devstack.sim.knobs import EngineKnobs
from devstack.sim.launcher import (
    DEFAULT_READY_TIMEOUT_S,
    EngineHandle,
    EngineLaunch,
    SpawnFn,
    launch_engine,
)
from devstack.sim.records import read_records
from devstack.sim.roles import Role

LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
DIST_INIT_PORT = 29500
"""Rank 0's port in a namespace of its own, where every port is free (torch's usual
MASTER_PORT); on a shared loopback a free port is chosen instead."""


@dataclass(frozen=True)
class GroupShape:
    """What every pod of one group is told about the group."""

    size: int
    leader_address: str
    dist_init_addr: str
    """``HOST:PORT`` of rank 0."""

    @classmethod
    def on(cls, network: GroupNetwork, size: int) -> GroupShape:
        """A group of ``size`` pods on ``network``, rank 0 on the first pod's address."""
        leader = network.pods[0].address
        port = DIST_INIT_PORT if network.kind == KIND_NETNS else free_port(leader)
        return cls(size, leader, f"{leader}:{port}")

    def lws_environment(self, index: int) -> dict[str, str]:
        return lws_environment(self.leader_address, self.size, index)


def lws_environment(leader_address: str, size: int, index: int) -> dict[str, str]:
    """What a LeaderWorkerSet puts in the environment of pod ``index`` (its every container:
    the engine's, and a coordinator sidecar's)."""
    return {LWS_LEADER_ADDRESS: leader_address, LWS_GROUP_SIZE: str(size),
            LWS_WORKER_INDEX: str(index)}


def spawn_beside(spawn: Callable[..., subprocess.Popen[Any]] | None, network: GroupNetwork,
                 index: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` as another container of pod ``index`` (a coordinator sidecar): in the
    pod's network namespace when it has one, with the pod's LeaderWorkerSet environment.
    ``kwargs`` go to ``spawn`` (the janitor's takes ``service=True``, ``stdout`` ...);
    without one, the process gets a session of its own."""
    place = network.pods[index]
    env = {**os.environ, **lws_environment(network.pods[0].address, len(network.pods), index)}
    full = [*place.argv_prefix, *argv]
    if spawn is not None:
        return spawn(full, env=env, **kwargs)
    return subprocess.Popen(full, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            **kwargs)


@dataclass
class Pod:
    """One running pod: its place on the network, its engine handle, its environment."""

    place: PodPlace
    engine: EngineHandle
    env: dict[str, str]

    @property
    def node_rank(self) -> int:
        return self.place.index

    @property
    def address(self) -> str:
        return self.place.address

    @property
    def pid(self) -> int:
        """The pod's main process (the container's)."""
        return self.engine.pid

    @property
    def url(self) -> str:
        """The leader's HTTP front end; empty for a follower."""
        return self.engine.url

    def rank_pids(self) -> dict[int, int]:
        """Global rank → PID of this pod's ranks."""
        return {p.rank: p.pid for p in self.engine.processes
                if p.role == Role.SCHEDULER.value and p.rank is not None}

    def pids(self) -> list[int]:
        """Every process of the pod as it came up, the main process first."""
        return [p.pid for p in self.engine.processes]


@dataclass(frozen=True)
class PodLaunch:
    """A pod started but not up yet (it is up once the whole group formed)."""

    place: PodPlace
    launch: EngineLaunch
    env: dict[str, str]

    def wait_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> Pod:
        return Pod(self.place, self.launch.wait_ready(timeout_s), self.env)


def launch_pod(
    spawn: SpawnFn | None,
    record_dir: Path | str,
    place: PodPlace,
    shape: GroupShape,
    knobs: EngineKnobs | None = None,
    **overrides: Any,
) -> PodLaunch:
    """Start pod ``place.index`` of the group without waiting for it. ``overrides`` are
    ``EngineKnobs`` fields; the group's own (host, nnodes, node_rank, dist_init_addr) are
    set from ``place`` and ``shape``."""
    knobs = replace(knobs or EngineKnobs(), **overrides)
    knobs = replace(knobs, host=place.address, nnodes=shape.size, node_rank=place.index,
                    dist_init_addr=shape.dist_init_addr)
    env = shape.lws_environment(place.index)
    launch = launch_engine(spawn, record_dir, knobs, argv_prefix=place.argv_prefix, env=env)
    return PodLaunch(place, launch, env)


@dataclass
class GroupHandle:
    """A running group: its network and its pods, the leader first."""

    network: GroupNetwork
    pods: list[Pod]

    @property
    def leader(self) -> Pod:
        return self.pods[0]

    @property
    def followers(self) -> list[Pod]:
        return self.pods[1:]

    @property
    def url(self) -> str:
        return self.leader.url

    def ranks(self) -> dict[int, int]:
        """Global rank → PID, across every pod."""
        return {rank: pid for pod in self.pods for rank, pid in pod.rank_pids().items()}

    def pod_of_rank(self, rank: int) -> Pod:
        return next(pod for pod in self.pods if rank in pod.rank_pids())

    def rank_records(self) -> dict[int, dict[str, Any]]:
        """Global rank → its end record (``devstack.sim.group.rank``), for those written."""
        pids = {pid: rank for rank, pid in self.ranks().items()}
        return {pids[r["pid"]]: r for pod in self.pods for r in read_records(pod.engine.record_dir)
                if r.get("pid") in pids}

    def kill(self) -> None:
        """SIGKILL every pod's main process still running and wait for it (its children
        die with it: PDEATHSIG). For a test's teardown, never for a stop that is judged."""
        kill_pods([pod.engine.proc for pod in self.pods])

    def close(self) -> None:
        """Delete the network (every pod must have ended)."""
        self.network.close()


def start_group(
    spawn: SpawnFn | None,
    record_dir: Path | str,
    size: int,
    knobs: EngineKnobs | None = None,
    *,
    network: GroupNetwork | str = KIND_AUTO,
    coordinators: Sequence[str] = (),
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    **overrides: Any,
) -> GroupHandle:
    """Start a group of ``size`` pods and return once every one is up.

    1. Make the network (``auto``, ``netns`` or ``loopback``), unless one is given.
    2. Start every pod, the leader first, each in ``record_dir/pod-<index>``; pod i
       registers with ``coordinators[i]`` when given.
    3. Wait until each wrote its ready file: the group is formed.
    On a failure every pod started is SIGKILLed and waited for, the network made here is
    deleted, and ``SimStartupError`` is raised.
    """
    made = not isinstance(network, GroupNetwork)
    net = make_network(size, network) if isinstance(network, str) else network
    shape = GroupShape.on(net, size)
    launches: list[PodLaunch] = []
    try:
        for place in net.pods[:size]:
            extra = {"coordinator": coordinators[place.index]} if coordinators else {}
            launches.append(launch_pod(spawn, Path(record_dir) / f"pod-{place.index}", place,
                                       shape, knobs, **overrides, **extra))
        pods = [launch.wait_ready(ready_timeout_s) for launch in launches]
    except BaseException:
        kill_pods([launch.launch.proc for launch in launches])
        if made:
            net.close()
        raise
    return GroupHandle(net, pods)


def kill_pods(procs: Sequence[Any]) -> None:
    """SIGKILL each process still running, then reap it."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()
