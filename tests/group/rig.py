"""A group of real coordinators (one per pod, real processes on loopback ports) and the
simulated multi-node engine (devstack/sim/group) whose pods register with them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devstack.sim.group.launcher import GroupHandle, start_group
from devstack.sim.group.network import KIND_LOOPBACK
from devstack.sim.group.protocol import CAUSE_FINISHED
from devstack.sim.group.rank import RANK_ROLE
from tests.service.servers import Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "group-secret"
"""The token every coordinator of the group has (peers authenticate with it)."""
SIZE = 4
"""A leader and 3 followers, one rank each."""
WAIT_S = 120.0
"""Bounds a failing test only: every wait is for an event."""
GROUP_FAST = ["--grace-period", "40", "--safety-margin", "1", "--tier-timeout", "5",
              "--confirm-timeout", "1", "--prekill-timeout", "2", "--scan-interval", "0.5"]
"""A budget that a loaded 2-core machine never runs out of (tests wait for events, so a
passing test never waits for it): B = 39 s, the followers' kills keep 9.75 s."""


@dataclass
class Coordinators:
    """The group's coordinators, the leader first."""

    all: list[Running]
    token_file: str
    """The token's file ("" without one), for the simulated engine's registrations."""

    @property
    def leader(self) -> Running:
        return self.all[0]

    @property
    def followers(self) -> list[Running]:
        return self.all[1:]


def start_coordinators(janitor: ProcessJanitor, tmp: Path, size: int = SIZE, *args: str,
                       leader_url: str | None = None, follower_args: tuple[str, ...] = (),
                       token: str | None = TOKEN) -> Coordinators:
    """Start the leader's coordinator, then each follower's told of it (``leader_url``
    overrides where the followers look for it), all with the same ``token``."""
    leader = start_coordinator(janitor, tmp, *GROUP_FAST, "--group-size", str(size),
                               "--group-index", "0", *args, token=token, name="coordinator-0")
    running = [leader]
    for index in range(1, size):
        running.append(start_coordinator(
            janitor, tmp, *GROUP_FAST, "--group-size", str(size), "--group-index", str(index),
            "--group-leader", leader_url or leader.url, *args, *follower_args, token=token,
            name=f"coordinator-{index}"))
    return Coordinators(running, str(tmp / "coordinator-0.token") if token else "")


def group_status(running: Running) -> dict[str, Any]:
    group: dict[str, Any] = running.status()["group"]
    return group


def wait_announced(coordinators: Coordinators) -> None:
    """Every follower is listed by the leader."""
    size = len(coordinators.all)

    def listed() -> bool:
        members = group_status(coordinators.leader)["members"]
        return {m["index"] for m in members} == set(range(1, size))

    wait_for(listed, timeout=WAIT_S, what="every follower announced to the leader")


def start_sim(janitor: ProcessJanitor, tmp: Path, groups: list[GroupHandle],
              coordinators: Coordinators, **knobs: Any) -> GroupHandle:
    """The simulated multi-node engine, pod i registered with coordinator i (its main
    process and its rank), on loopback addresses; waits until every registration shows."""
    knobs = {"schedulers": 1, "token_interval_ms": 20, "graceful_main": True,
             "collective_timeout_s": 5.0, **knobs}
    group = start_group(janitor.spawn, tmp / "sim", len(coordinators.all),
                        network=KIND_LOOPBACK, coordinators=[c.url for c in coordinators.all],
                        coordinator_token_file=coordinators.token_file, **knobs)
    groups.append(group)
    for pod, running in zip(group.pods, coordinators.all, strict=True):
        expected = {pod.pid, *pod.rank_pids().values()}

        def registered(running: Running = running, expected: set[int] = expected) -> bool:
            workers = running.status()["workers"]
            return {w["pid"] for w in workers if w.get("connected")} >= expected and \
                any(w["role"] == RANK_ROLE for w in workers)

        wait_for(registered, timeout=WAIT_S, what=f"pod {pod.node_rank} registered")
    return group


async def drain_all(urls: list[str], *, token: str | None = TOKEN,
                    main_caller: bool = False) -> list[dict[str, Any]]:
    """``GET /drain`` on each coordinator at once, as every preStop hook of a group deletion
    runs (``main_caller``: ``?main=caller``, as the manifests' hook calls it, and then the
    kubelet's SIGTERM to the main processes it was left, once its hook returned); their
    answers, in order."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    query = "?main=caller" if main_caller else ""
    async with httpx.AsyncClient(timeout=WAIT_S, headers=headers) as client:

        async def hook(url: str) -> httpx.Response:
            answer = await client.get(f"{url}/drain{query}")
            if answer.status_code == 200:
                for pid in answer.json().get("main_left_to_caller") or ():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
            return answer

        answers = await asyncio.gather(*(hook(url) for url in urls))
    for answer in answers:
        assert answer.status_code == 200, answer.text
    return [a.json() for a in answers]


def summary_key(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=True)


async def exit_codes(group: GroupHandle) -> list[int]:
    return [await asyncio.to_thread(pod.engine.proc.wait, WAIT_S) for pod in group.pods]


def assert_group_summary(summary: dict[str, Any], group: GroupHandle) -> None:
    """The group summary lists every process of every pod once, each ended as its own
    record says: every rank finished the group and exited 0, every pod's main exited 0."""
    assert summary["complete"] is True, summary["pods"]
    assert summary["outcome"] == "graceful", summary["pods"]
    assert [p["mode"] for p in summary["pods"]] == ["group"] * len(group.pods)
    listed = {(p["pod"], p["pid"]): p for p in summary["processes"]}
    assert len(listed) == len(summary["processes"])
    for pod in group.pods:
        for pid in pod.pids():
            entry = listed[(pod.node_rank, pid)]
            assert entry["fate"] in ("exited", "gone"), entry
            assert entry["exit_code"] == 0, entry
    records = group.rank_records()
    assert records.keys() == set(group.ranks())
    for rank, record in records.items():
        assert (record["exit_code"], record["cause"], record["cleanup"]) == (
            0, CAUSE_FINISHED, "finished"), (rank, record)
        pod = group.pod_of_rank(rank)
        assert listed[(pod.node_rank, record["pid"])]["exit_code"] == record["exit_code"]
