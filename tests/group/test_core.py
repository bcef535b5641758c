"""The group's pure core, without sleeping: the follower's table, the loss bound, the
budget's arithmetic, the summary merge, membership from settings and the LWS environment,
and the retry policy with an injected sleep."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.group.budget import group_budget
from coordinator.group.membership import GroupSettingError, membership
from coordinator.group.node import check_record
from coordinator.group.peer import LeaderUnreachable, PeerRefused, retrying
from coordinator.group.summary import PodReport, merge
from coordinator.group.table import (
    KILL_MAY_RUN,
    TRANSITIONS,
    FollowerEvent,
    FollowerState,
    leader_lost,
    step,
)

S, E = FollowerState, FollowerEvent


def test_every_state_has_its_row_and_every_move_lands_on_a_state() -> None:
    """1. The table has a row for every state. 2. Every target is a state. 3. Only the
    released, local and reported states let the kill run."""
    assert set(TRANSITIONS) == set(S)
    assert all(isinstance(t, S) for row in TRANSITIONS.values() for t in row.values())
    assert {S.RELEASED, S.LOCAL, S.REPORTED} == KILL_MAY_RUN


@pytest.mark.parametrize(("events", "final"), [
    ([E.ANNOUNCED, E.LEADER_DRAINING, E.LEADER_ENGINE_STOPPED, E.REPORTED], S.REPORTED),
    ([E.ANNOUNCED, E.DRAIN_STARTED, E.LEADER_LOST, E.REPORTED], S.REPORTED),
    ([E.DRAIN_STARTED, E.GATE_EXPIRED], S.RELEASED),
    ([E.ANNOUNCED, E.LEADER_DRAINING, E.ABORTED], S.JOINED),
    ([E.ANNOUNCED, E.LEADER_LOST], S.JOINED),
    ([E.DRAIN_STARTED, E.LEADER_LOST, E.LEADER_ENGINE_STOPPED], S.LOCAL),
    ([E.DRAIN_STARTED, E.LEADER_ENGINE_STOPPED, E.ABORTED, E.LEADER_LOST], S.RELEASED),
    ([E.DRAIN_STARTED, E.GATE_EXPIRED, E.REPORTED, E.NEW_CYCLE], S.JOINING),
])
def test_a_follower_moves_only_as_the_table_says(events: list[FollowerEvent],
                                                 final: FollowerState) -> None:
    """1. Start joining. 2. Apply each event: a move the table lists changes the state, any
    other leaves it (a leader lost while serving is no drain; once released, nothing but
    the report or a new cycle moves it). 3. The final state is the expected one."""
    state = S.JOINING
    for event in events:
        state = step(state, event) or state
    assert state is final


def test_the_leader_is_lost_only_after_the_bound() -> None:
    """Reachable: never lost; unreachable: lost once ``bound`` seconds have passed."""
    assert not leader_lost(None, 100.0, 10.0)
    assert not leader_lost(95.0, 100.0, 10.0)
    assert leader_lost(90.0, 100.0, 10.0)


@pytest.mark.parametrize(("total", "share", "confirm", "follower_kill"), [
    (25.0, 0.25, 2.0, 6.25),     # the default: 30 s grace, 5 s margin
    (8.0, 0.25, 2.0, 3.0),       # a short budget: confirmation and 1 s at least
    (4.0, 0.25, 2.0, 2.0),       # never more than half
    (39.0, 0.25, 1.0, 9.75),
])
def test_the_budget_leaves_the_followers_their_kill(total: float, share: float,
                                                    confirm: float, follower_kill: float) -> None:
    """1. Split a budget. 2. The followers keep ``max(share * B, confirm + 1)``, at most
    ``B / 2``; the leader drains in the rest; a follower's gate opens when the leader's
    drain ends."""
    budget = group_budget(total, confirm_s=confirm, follower_share=share)
    assert budget.follower_kill_s == pytest.approx(follower_kill)
    assert budget.leader_s == pytest.approx(total - follower_kill)
    assert budget.gate_at(1000.0) == pytest.approx(1000.0 + total - follower_kill)


def _report(index: int, outcome: str, *pids: int) -> PodReport:
    return PodReport(index=index, outcome=outcome, processes=tuple(
        {"pid": pid, "name": "p", "role": None, "fate": "exited", "exit_code": 0}
        for pid in pids))


def test_the_summary_merges_every_pod_and_waits_for_the_missing() -> None:
    """1. Merge the leader's and one of two followers' reports: incomplete, no outcome yet,
    every process listed with its pod. 2. Add the last: complete and graceful. 3. A pod
    that is not graceful gives the group its outcome."""
    partial = merge(3, {0: _report(0, "graceful", 10, 11), 2: _report(2, "graceful", 30)})
    assert (partial["complete"], partial["outcome"]) == (False, None)
    assert [(p["pod"], p["pid"]) for p in partial["processes"]] == [(0, 10), (0, 11), (2, 30)]
    assert [p["reported"] for p in partial["pods"]] == [True, False, True]
    whole = merge(3, {0: _report(0, "graceful"), 1: _report(1, "graceful"),
                      2: _report(2, "graceful")})
    assert (whole["complete"], whole["outcome"]) == (True, "graceful")
    bad = merge(3, {0: _report(0, "graceful"), 1: _report(1, "killed")})
    assert (bad["complete"], bad["outcome"]) == (False, "killed")


def _settings(**given: Any) -> Any:
    values = {"group_leader": None, "group_size": None, "group_index": None,
              "group_url": None, "port": 8787, **given}
    return SimpleNamespace(**values)


def test_membership_from_the_leaderworkerset_environment_and_from_settings() -> None:
    """1. No setting, no LWS variable: no group. 2. The LWS variables of a follower: its
    index, the group's size, the leader's coordinator on this coordinator's port. 3. Index 0
    is the leader. 4. Settings win over the environment. 5. A group of one is no group."""
    assert membership(_settings(), {}) is None
    env = {"LWS_LEADER_ADDRESS": "10.0.0.7", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "2"}
    found = membership(_settings(), env)
    assert found is not None
    assert (found.index, found.size, found.leader_url, found.is_leader) == (
        2, 4, "http://10.0.0.7:8787", False)
    leader = membership(_settings(), {**env, "LWS_WORKER_INDEX": "0"})
    assert leader is not None
    assert leader.is_leader
    flagged = membership(_settings(group_index=3, group_leader="http://h:1"), env)
    assert flagged is not None
    assert (flagged.index, flagged.leader_url) == (3, "http://h:1")
    assert membership(_settings(group_size=1, group_index=0), {}) is None


@pytest.mark.parametrize(("given", "env", "says"), [
    ({"group_size": 4}, {}, "needs its size and this pod's index"),
    ({"group_size": 4, "group_index": 4}, {}, "outside [0, 3]"),
    ({"group_size": 4, "group_index": 1}, {}, "needs its leader's coordinator"),
    ({}, {"LWS_GROUP_SIZE": "four", "LWS_WORKER_INDEX": "1"}, "is not an integer"),
    ({"port": 0}, {"LWS_LEADER_ADDRESS": "10.0.0.7", "LWS_GROUP_SIZE": "2",
                   "LWS_WORKER_INDEX": "1"}, "needs a fixed --port"),
])
def test_membership_that_cannot_be_is_refused_in_words(given: dict[str, Any],
                                                       env: dict[str, str], says: str) -> None:
    with pytest.raises(GroupSettingError, match=says.replace("[", r"\[")):
        membership(_settings(**given), env)


async def test_the_retry_policy_retries_the_unreachable_only_and_is_bounded() -> None:
    """1. With an injected sleep, a call unreachable twice then answering is tried three
    times. 2. A refusal (4xx) is not retried. 3. ``give_up`` stops the retries."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise LeaderUnreachable("down")
        return "ok"

    async for attempt in retrying(60.0, sleep=sleep):
        with attempt:
            result = await flaky()
    assert (result, calls, len(slept)) == ("ok", 3, 2)

    async def refused() -> None:
        async for attempt in retrying(60.0, sleep=sleep):
            with attempt:
                raise PeerRefused(401, "no token")

    async def given_up() -> None:
        async for attempt in retrying(60.0, give_up=lambda: True, sleep=sleep):
            with attempt:
                raise LeaderUnreachable("down")

    slept.clear()
    with pytest.raises(PeerRefused):
        await refused()
    with pytest.raises(LeaderUnreachable):
        await given_up()
    assert slept == []


@pytest.mark.parametrize("record", [
    "draining", {"state": "draining"}, {"index": 1, "state": "lost"},
    {"index": 0, "members": [{"index": 1}]},
    {"index": 0, "members": [{"index": 1, "announced_at": "soon"}]},
])
def test_a_group_record_a_node_cannot_restore_is_refused(record: Any) -> None:
    """A state file's ``group`` that a node cannot take over raises, so the whole file is set
    aside as corrupt (``coordinator/service/restore.py``), never half restored."""
    with pytest.raises((ValueError, KeyError, TypeError)):
        check_record(record)


def test_a_group_record_a_node_can_restore_passes() -> None:
    check_record(None)
    check_record({"index": 1, "state": "draining", "mode": "group", "reason": None})
    check_record({"index": 0, "members": [{"index": 1, "url": None, "announced_at": 1.0,
                                           "report": None}]})


def test_the_package_exports_what_its_all_names() -> None:
    """Every name of ``coordinator.group.__all__`` resolves to what its module defines."""
    import coordinator.group as group
    from coordinator.group import membership as membership_module
    from coordinator.group import node

    assert sorted(group.__all__) == ["ControllerHost", "GroupNode", "GroupSettingError",
                                     "Membership"]
    assert group.GroupNode is node.GroupNode
    assert group.Membership is membership_module.Membership
