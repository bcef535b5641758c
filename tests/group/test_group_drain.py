"""A group of a leader and 3 followers (the simulated multi-node engine, a coordinator per
pod) drained as one: by all four preStop hooks at once, as a group deletion runs them, and
by the leader's alone. What happened is read from the ranks' own records, the pods' exit
statuses and /proc, and held against the group summary."""

from __future__ import annotations

import asyncio
from pathlib import Path

from devstack.sim.group.launcher import GroupHandle
from tests.group.rig import (
    WAIT_S,
    Coordinators,
    assert_group_summary,
    drain_all,
    exit_codes,
    start_coordinators,
    start_sim,
    summary_key,
    wait_announced,
)
from tests.migration.stack import Load, Pod, start_pod, start_router
from tests.sim.support import assert_nothing_left
from tests.support.processes import ProcessJanitor

STREAMS = 8
MAX_TOKENS = 60
MIN_TOKENS = 3


def _spare_pod(janitor: ProcessJanitor, tmp: Path) -> Pod:
    """Another engine (its own coordinator) behind the same router: where the group's
    handed-back streams continue. Scenery: the janitor stops it at the end."""
    pod = start_pod(janitor, tmp, "spare", token_interval_ms=20.0)
    janitor.service(pod.engine.proc, exit_code=0)
    return pod


def _leader_pod(group: GroupHandle, coordinators: Coordinators) -> Pod:
    """The group's leader as the router sees it: its front end and its coordinator."""
    return Pod(group.leader.engine, coordinators.leader)


async def _drained_under_load(janitor: ProcessJanitor, tmp: Path, groups: list[GroupHandle],
                              every_hook: bool, main_caller: bool = False) -> None:
    # No token: the reference router acknowledges handoffs without one (the peer calls'
    # token is held in test_faults.py).
    coordinators = start_coordinators(janitor, tmp, token=None)
    wait_announced(coordinators)
    group = start_sim(janitor, tmp, groups, coordinators, hold_after_tokens=MIN_TOKENS)
    spare = _spare_pod(janitor, tmp)
    router = start_router(janitor, tmp, [_leader_pod(group, coordinators), spare])
    load = Load(router, STREAMS, MAX_TOKENS, MIN_TOKENS)
    running = asyncio.create_task(load.run())
    await asyncio.wait_for(load.started.wait(), WAIT_S)

    urls = [c.url for c in coordinators.all] if every_hook else [coordinators.leader.url]
    answers = await drain_all(urls, token=None, main_caller=main_caller)
    if main_caller:  # the hooks returned at the handover: each drain's end, joined
        assert answers[0]["main_left_to_caller"] == [group.leader.pid], answers[0]
        answers = await drain_all(urls, token=None)
    streams = await asyncio.wait_for(running, WAIT_S)

    broken = [(s.prompt, len(s.tokens), s.error) for s in streams if not s.exact]
    assert not broken, broken
    assert await exit_codes(group) == [0] * len(group.pods)
    assert_nothing_left(group)
    leader = answers[0]
    assert (leader["phase"], leader["outcome"]) == ("done", "graceful"), leader["drain"]
    assert leader["migration_counts"]["expired"] == 0
    assert leader["migration_counts"]["handed_back"] >= 1
    assert_group_summary(leader["group"]["summary"], group)
    for answer in answers[1:]:
        assert (answer["phase"], answer["outcome"]) == ("done", "graceful"), answer["drain"]
        assert summary_key(answer["group"]["summary"]) == summary_key(
            leader["group"]["summary"])
    for follower in coordinators.followers:
        status = await asyncio.to_thread(follower.status)
        assert status["outcome"] == "graceful"
        assert (status["group"]["state"], status["group"]["mode"]) == ("reported", "group")
        assert summary_key(status["group"]["summary"]) == summary_key(
            leader["group"]["summary"])


async def test_a_group_deletion_drains_the_group_as_one(
        janitor: ProcessJanitor, tmp_path: Path, sim_groups: list[GroupHandle],
) -> None:
    """1. Start a coordinator per pod (the leader's, then three followers' told of it) and
    wait until the followers are announced. 2. Start the group (a rank per pod, each pod's
    main and rank registered with its coordinator), a spare engine, and the reference router
    over the leader's front end and the spare. 3. Stream 8 requests through the router; the
    leader holds its streams after 3 tokens. 4. Call every coordinator's GET /drain at once,
    as a group deletion runs every preStop hook. 5. Every stream completes exactly (the
    leader's were handed back and continued on the spare: none lost). 6. Every pod's main
    exits 0, every rank finished the group and exited 0 (its own record), nothing is left
    in /proc. 7. Each answer is graceful and carries the same complete group summary, which
    lists every process of every pod as its record says; each follower's /status shows it."""
    await _drained_under_load(janitor, tmp_path, sim_groups, every_hook=True)


async def test_the_leaders_drain_alone_drains_the_group(
        janitor: ProcessJanitor, tmp_path: Path, sim_groups: list[GroupHandle],
) -> None:
    """1-3. As above. 4. Call only the leader's GET /drain (the leader pod deleted, or an
    operator's drain). 5-7. As above: the followers follow the leader's drain, stop what is
    left of their ranks only after the leader's engine stopped, and report; the leader's
    answer waits for their reports and carries the complete group summary."""
    await _drained_under_load(janitor, tmp_path, sim_groups, every_hook=False)


async def test_a_group_deletion_with_the_manifests_hook_hands_the_mains_to_the_kubelet(
        janitor: ProcessJanitor, tmp_path: Path, sim_groups: list[GroupHandle],
) -> None:
    """1-3. As above. 4. Call every coordinator's ``GET /drain?main=caller`` at once (the
    manifests' preStop hook); when a hook returns, SIGTERM the main processes it was left,
    as the kubelet does. 5-7. As above: the leader's engine-first tier is handed to the
    kubelet's SIGTERM, the group still stops in the safe order, and every drain's end (joined
    again) carries the complete, graceful group summary."""
    await _drained_under_load(janitor, tmp_path, sim_groups, every_hook=True, main_caller=True)
