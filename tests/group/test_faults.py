"""A group's faults, with real coordinators on loopback ports: a leader a follower cannot
reach, a leader lost mid-drain, one follower pod deleted alone, a follower coordinator
restarted mid-group-drain. Small test trees (tests/service/trees.py) stand in for a pod's
ranks where the fault is between the coordinators; the simulated multi-node engine where
the ranks' fates are the point."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devstack.sim.group.launcher import GroupHandle
from tests.group.rig import (
    GROUP_FAST,
    TOKEN,
    WAIT_S,
    assert_group_summary,
    drain_all,
    exit_codes,
    group_status,
    start_coordinators,
    start_sim,
    wait_announced,
)
from tests.kill.helpers import alive
from tests.service.servers import Running, hold_drains, register, start_coordinator
from tests.service.trees import start_tree
from tests.sim.support import assert_nothing_left
from tests.support.processes import ProcessJanitor, wait_for

LEADER_TIMEOUT = ("--group-leader-timeout", "1")
NO_DOORBELL = ("--doorbell", "off")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _drain(running: Running, **body: Any) -> httpx.Response:
    with running.client(timeout=WAIT_S) as client:
        return client.post("/drain", json=body)


@dataclass
class HeldDrain:
    """A leader's drain held in migrating, its follower following with its kill held."""

    holder: dict[str, Any]
    """The leader's worker, a request in flight: the leader's drain waits for it."""
    holder_id: str
    tree: dict[str, Any]
    """The follower's registered tree."""

    def release(self, leader: Running) -> None:
        """The leader's worker reports nothing in flight: the leader's drain goes on."""
        with leader.client() as client:
            client.post(f"/workers/{self.holder_id}/report",
                        json={"inflight": 0}).raise_for_status()


def _hold_a_group_drain(janitor: ProcessJanitor, tmp: Path, leader: Running,
                        follower: Running, *, children: int = 2) -> HeldDrain:
    """1. Register a worker with a request in flight at the leader and a tree (``children``)
    at the follower. 2. Drain the leader without waiting. 3. Wait until the follower follows
    it, its kill held (``draining``)."""
    holder = start_tree(janitor, tmp, children=0, tag="holder")
    holder_id = hold_drains(leader, holder["pid"])
    tree = start_tree(janitor, tmp, children=children)
    register(follower, tree["pid"])
    assert _drain(leader, wait=False).status_code == 202
    wait_for(lambda: group_status(follower)["state"] == "draining", timeout=WAIT_S,
             what="the follower following the leader's drain")
    return HeldDrain(holder, holder_id, tree)


def _assert_drained_alone(follower: Running, tree: dict[str, Any]) -> dict[str, Any]:
    """The follower's preStop hook (GET /drain) answers a graceful drain of its own pod,
    ``local``, with the leader unreachable as the reason, its tree ended."""
    with follower.client(timeout=WAIT_S) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    assert (summary["phase"], summary["outcome"]) == ("done", "graceful"), summary["drain"]
    assert summary["group"]["mode"] == "local"
    assert "could not be reached" in summary["group"]["reason"]
    _assert_tree_ended(tree, summary)
    return summary


def _assert_tree_ended(tree: dict[str, Any], summary: dict[str, Any]) -> None:
    listed = {p["pid"]: p for p in summary["processes"]}
    assert set(tree["all"]) <= set(listed)
    assert not [pid for pid in tree["all"] if alive(pid)]
    assert listed[tree["pid"]]["exit_code"] == 0


def test_a_follower_that_cannot_reach_its_leader_drains_alone_and_says_so(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a follower whose leader's address answers nothing (a closed port), its
    loss bound 1 s, a tree registered. 2. GET /drain, as its preStop hook. 3. The drain
    waits for the leader at most the bound, then runs alone: graceful, the tree ended,
    and the answer's ``group`` says ``local`` with the leader unreachable as the reason."""
    follower = start_coordinator(
        janitor, tmp_path, "--group-size", "2", "--group-index", "1", "--group-leader",
        f"http://127.0.0.1:{_closed_port()}", *LEADER_TIMEOUT, token=TOKEN, name="follower")
    tree = start_tree(janitor, tmp_path)
    register(follower, tree["pid"])
    group = _assert_drained_alone(follower, tree)["group"]
    assert group["state"] == "local"
    assert group["leader"]["reachable"] is False


def test_a_follower_whose_leader_is_silent_drains_alone(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a follower whose leader's address accepts connections and never answers (a
    listening socket nobody reads: a hung node), its loss bound 1 s, a tree registered.
    2. GET /drain. 3. Each call to the leader outlives its timeout; the drain then runs
    alone: graceful, the tree ended, ``group`` ``local``, the leader unreachable."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        follower = start_coordinator(
            janitor, tmp_path, "--group-size", "2", "--group-index", "1", "--group-leader",
            f"http://127.0.0.1:{silent.getsockname()[1]}", *LEADER_TIMEOUT, token=TOKEN,
            name="follower")
        tree = start_tree(janitor, tmp_path)
        register(follower, tree["pid"])
        _assert_drained_alone(follower, tree)


def test_a_follower_whose_token_the_leader_refuses_drains_alone(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader with the group's token, a follower with another. 2. The leader never
    lists it (401) and the follower shows the refusal. 3. The follower's drain goes on
    alone after the bound, saying so; the leader is not drained by it."""
    leader = start_coordinator(janitor, tmp_path, "--group-size", "2", "--group-index", "0",
                               token=TOKEN, name="leader")
    follower = start_coordinator(
        janitor, tmp_path, "--group-size", "2", "--group-index", "1", "--group-leader",
        leader.url, *LEADER_TIMEOUT, token="not-the-group-token", name="follower")
    wait_for(lambda: "401" in str(group_status(follower)["leader"]["error"]),
             timeout=WAIT_S, what="the leader's refusal shown")
    assert group_status(leader)["members"] == []
    summary = _drain(follower).json()
    assert summary["group"]["mode"] == "local"
    assert leader.status()["phase"] == "serving"


def test_a_leader_lost_mid_drain_leaves_its_followers_to_drain_alone(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader and one follower (loss bound 1 s), a tree registered at the follower;
    the leader's drain held in migrating by a worker with a request in flight. 2. Drain the
    leader: the follower follows and holds its kill (state ``draining``). 3. SIGKILL the
    leader's coordinator. 4. The follower sees it unreachable for the bound, then drains
    alone: done, graceful, its tree ended, ``group`` ``local`` with the reason."""
    # No doorbell: a coordinator SIGKILLed cannot remove its pipe.
    coordinators = start_coordinators(janitor, tmp_path, 2, *NO_DOORBELL,
                                      follower_args=LEADER_TIMEOUT)
    leader, follower = coordinators.all
    wait_announced(coordinators)
    held = _hold_a_group_drain(janitor, tmp_path, leader, follower)
    holder, tree = held.holder, held.tree
    assert follower.status()["phase"] in ("draining", "migrating")
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(timeout=WAIT_S)
    _assert_drained_alone(follower, tree)
    janitor.service(holder["pid"], exit_code=0)  # the leader's engine: nobody drained it


def test_a_follower_restarted_mid_group_drain_resumes_it(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader and one follower with a state file, a tree at the follower; the leader's
    drain held in migrating. 2. Drain the leader; the follower follows and holds its kill;
    its state file says so. 3. SIGKILL the follower's coordinator and start it again on the
    same port and file: it resumes the drain, still holding the kill (``draining``).
    4. Release the leader (its worker reports 0 in flight): the leader finishes, the
    follower's kill runs, the follower reports, and both show the complete summary, the
    tree's processes under pod 1."""
    state = tmp_path / "follower.state.json"
    port = _closed_port()
    follower_args = ("--state-file", str(state), "--port", str(port))
    coordinators = start_coordinators(janitor, tmp_path, 2, *NO_DOORBELL,
                                      follower_args=follower_args)
    leader, follower = coordinators.all
    wait_announced(coordinators)
    held = _hold_a_group_drain(janitor, tmp_path, leader, follower)
    tree = held.tree

    def held_on_disk() -> bool:
        document = json.loads(state.read_text()) if state.exists() else {}
        return (document.get("group") or {}).get("state") == "draining" and \
            document.get("phase") in ("draining", "migrating")

    wait_for(held_on_disk, timeout=WAIT_S, what="the follower's held drain on disk")
    follower.proc.send_signal(signal.SIGKILL)
    follower.proc.wait(timeout=WAIT_S)
    again = start_coordinator(janitor, tmp_path, "--group-size", "2", "--group-index", "1",
                              "--group-leader", leader.url, *follower_args, *NO_DOORBELL,
                              *GROUP_FAST, token=TOKEN, name="follower-again")
    status = again.status()
    assert status["phase"] in ("draining", "migrating", "terminating")
    assert any(t["note"] == "resumed" for t in status["timeline"])
    assert status["group"]["state"] == "draining"
    assert alive(tree["pid"])

    held.release(leader)
    with again.client(timeout=WAIT_S) as client:
        summary = client.get("/drain").json()
    assert (summary["phase"], summary["outcome"]) == ("done", "graceful"), summary["drain"]
    assert summary["group"]["mode"] == "group"
    _assert_tree_ended(tree, summary)
    wait_for(lambda: group_status(leader)["summary"]["complete"], timeout=WAIT_S,
             what="the leader's complete group summary")
    merged = group_status(leader)["summary"]
    assert {p["pid"] for p in merged["processes"] if p["pod"] == 1} >= set(tree["all"])
    assert {p["pid"] for p in merged["processes"] if p["pod"] == 0} >= {held.holder["pid"]}


async def test_one_follower_pod_deleted_alone_drains_the_whole_group(
        janitor: ProcessJanitor, tmp_path: Path, sim_groups: list[GroupHandle],
) -> None:
    """1. A coordinator per pod, the simulated group of four registered with them.
    2. Only follower pod 2's preStop hook runs (the pod deleted or evicted alone).
    3. Its drain is forwarded to the leader, so the group drains in the safe order: the
    leader's engine stops first and finishes the group, then each follower ends what is
    left. 4. Every rank finished the group and exited 0, every pod's main exited 0, nothing
    is left; the group summary is complete and graceful. (Per pod, the same hook breaks
    the group: tests/sim/test_multinode_coordination.py.)"""
    coordinators = start_coordinators(janitor, tmp_path)
    wait_announced(coordinators)
    group = start_sim(janitor, tmp_path, sim_groups, coordinators)
    (answer,) = await drain_all([coordinators.all[2].url])
    assert (answer["phase"], answer["outcome"]) == ("done", "graceful"), answer["drain"]
    assert await exit_codes(group) == [0] * len(group.pods)
    assert_nothing_left(group)
    leader = await asyncio.to_thread(coordinators.leader.status)
    assert leader["drain"]["reason"].startswith("group: member 2 draining"), leader["drain"]
    wait_for(lambda: group_status(coordinators.leader)["summary"]["complete"],
             timeout=WAIT_S, what="the complete group summary")
    assert_group_summary(group_status(coordinators.leader)["summary"], group)


def test_a_leader_drain_aborted_aborts_the_drains_it_started(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader and one follower, a tree at the follower; the leader's drain held in
    migrating. 2. Drain the leader: the follower follows (``draining``, its kill held, its
    readiness failing). 3. DELETE /drain on the leader. 4. The follower's drain is aborted
    too: serving again, ready, the group state back to ``joined``, its tree untouched."""
    coordinators = start_coordinators(janitor, tmp_path, 2)
    leader, follower = coordinators.all
    wait_announced(coordinators)
    held = _hold_a_group_drain(janitor, tmp_path, leader, follower, children=0)
    holder, tree = held.holder, held.tree
    assert httpx.get(f"{follower.url}/readyz").status_code == 503
    with leader.client() as client:
        assert client.delete("/drain").status_code == 200

    def serving_again() -> bool:
        status = follower.status()
        return bool(status["phase"] == "serving" and status["group"]["state"] == "joined")

    wait_for(serving_again, timeout=WAIT_S, what="the follower's drain aborted")
    assert httpx.get(f"{follower.url}/readyz").status_code == 200
    assert all(alive(pid) for pid in tree["all"])
    janitor.service(holder["pid"], exit_code=0)
    janitor.service(tree["pid"], exit_code=0)


def test_a_leader_restarted_mid_group_drain_resumes_it_with_its_members(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader with a state file on a fixed port and one follower (its loss bound long
    enough for a restart), a tree at the follower; the leader's drain held in migrating.
    2. Drain the leader; the follower follows and holds its kill. 3. SIGKILL the leader's
    coordinator and start it again on the same port and file: it resumes the drain, its
    member listed from the file. 4. Release the leader's worker: the leader finishes, the
    follower's kill runs after it (``group`` mode, never ``local``), the follower reports,
    and the restarted leader shows the complete, graceful group summary."""
    state = tmp_path / "leader.state.json"
    port = _closed_port()
    leader_args = ("--state-file", str(state), "--port", str(port), *NO_DOORBELL)
    leader = start_coordinator(janitor, tmp_path, *GROUP_FAST, "--group-size", "2",
                               "--group-index", "0", *leader_args, token=TOKEN, name="leader")
    follower = start_coordinator(janitor, tmp_path, *GROUP_FAST, "--group-size", "2",
                                 "--group-index", "1", "--group-leader", leader.url,
                                 "--group-leader-timeout", "60", token=TOKEN, name="follower")
    wait_for(lambda: [m["index"] for m in group_status(leader)["members"]] == [1],
             timeout=WAIT_S, what="the follower announced")
    held = _hold_a_group_drain(janitor, tmp_path, leader, follower)
    tree = held.tree

    def members_on_disk() -> bool:
        document = json.loads(state.read_text()) if state.exists() else {}
        return [m["index"] for m in (document.get("group") or {}).get("members", [])] == [1] \
            and document.get("phase") == "migrating"

    wait_for(members_on_disk, timeout=WAIT_S, what="the leader's members on disk")
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(timeout=WAIT_S)
    again = start_coordinator(janitor, tmp_path, *GROUP_FAST, "--group-size", "2",
                              "--group-index", "0", *leader_args, token=TOKEN,
                              name="leader-again")
    status = again.status()
    assert status["phase"] == "migrating"
    assert [m["index"] for m in status["group"]["members"]] == [1]

    held.release(again)
    with again.client() as client:
        summary = client.get("/drain", timeout=WAIT_S).json()
    assert (summary["phase"], summary["outcome"]) == ("done", "graceful"), summary["drain"]
    merged = summary["group"]["summary"]
    assert (merged["complete"], merged["outcome"]) == (True, "graceful"), merged["pods"]
    assert [p["mode"] for p in merged["pods"]] == ["group", "group"]
    assert {p["pid"] for p in merged["processes"] if p["pod"] == 1} >= set(tree["all"])
    assert not [pid for pid in tree["all"] if alive(pid)]


def test_a_force_drain_of_a_follower_waits_for_nobody(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A leader and one follower, a tree at the follower; the leader's drain held in
    migrating, so the follower's kill is held. 2. Drain the leader; the follower follows.
    3. POST /drain {"force": true} on the follower (an operator's quick stop): its kill runs
    at once, in force mode, while the leader still migrates; ``group`` says why the kill did
    not wait."""
    coordinators = start_coordinators(janitor, tmp_path, 2)
    leader, follower = coordinators.all
    wait_announced(coordinators)
    held = _hold_a_group_drain(janitor, tmp_path, leader, follower)
    holder, tree = held.holder, held.tree
    assert _drain(follower, force=True, wait=False).status_code == 202
    wait_for(lambda: follower.status()["phase"] == "done", timeout=WAIT_S,
             what="the follower's force drain done")
    summary = follower.status()
    assert summary["outcome"] == "killed", summary["drain"]
    assert summary["group"]["state"] in ("released", "reported")
    assert summary["group"]["reason"] == "a force drain does not wait for the leader"
    assert not [pid for pid in tree["all"] if alive(pid)]
    assert leader.status()["phase"] == "migrating"
    janitor.service(holder["pid"], exit_code=0)
