"""Tier planning and deadline arithmetic, as pure functions."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

import pytest

from coordinator.kill.policy import TierSpec
from coordinator.kill.tiers import (
    ROOTS_TIER,
    Member,
    PlannedTier,
    allotted_wait_s,
    confirm_reserve,
    confirm_wait_s,
    kept_for_later_s,
    last_tier_reserve_s,
    main_tier_index,
    match_tier,
    plan_tiers,
)


def member(pid: int, depth: int, *, root: int = 100, name: str = "python", cmd: str = "",
           role: str | None = None) -> Member:
    return Member(pid, None if depth == 0 else root, depth, name, cmd, role, root)


def plan(members: list[Member], specs: Mapping[int, Sequence[TierSpec]] | None = None,
         ) -> list[PlannedTier]:
    return plan_tiers(members, specs or {}, default_signal=signal.SIGTERM, default_timeout_s=10)


def test_default_order_is_deepest_first_roots_last() -> None:
    tiers = plan([member(100, 0), member(101, 1), member(102, 2), member(103, 1)])
    assert [(t.name, t.pids) for t in tiers] == [
        ("depth-2", (102,)),
        ("depth-1", (101, 103)),
        (ROOTS_TIER, (100,)),
    ]
    assert all(t.timeout_s == 10 for t in tiers)


def test_several_roots_share_depth_tiers_and_end_together() -> None:
    tiers = plan([member(100, 0), member(200, 0, root=200), member(201, 1, root=200),
                  member(101, 1)])
    assert [(t.name, t.pids) for t in tiers] == [("depth-1", (201, 101)), (ROOTS_TIER, (100, 200))]


def test_declared_tiers_come_first_in_declared_order() -> None:
    specs = (
        TierSpec("detokenizer", pattern=r"detokenizer", timeout_s=2),
        TierSpec("schedulers", pattern=r"scheduler", signal=signal.SIGINT, timeout_s=30),
    )
    tiers = plan(
        [member(100, 0), member(101, 1, cmd="-m sim.scheduler"), member(102, 2),
         member(103, 1, cmd="-m sim.detokenizer"), member(104, 1)],
        {100: specs},
    )
    assert [(t.name, t.pids, t.timeout_s) for t in tiers] == [
        ("detokenizer", (103,), 2),
        ("schedulers", (101,), 30),
        ("depth-2", (102,), 10),
        ("depth-1", (104,), 10),
        (ROOTS_TIER, (100,), 10),
    ]
    assert tiers[1].signals == ((101, signal.SIGINT),)


def test_roles_match_and_a_matching_root_keeps_its_place_but_takes_the_tier_settings() -> None:
    specs = {100: (TierSpec("main", roles=("worker",), signal=signal.SIGINT, timeout_s=40),)}
    tiers = plan([member(100, 0, role="worker"), member(101, 1)], specs)
    assert [(t.name, t.signals, t.timeout_s) for t in tiers] == [
        ("depth-1", ((101, signal.SIGTERM),), 10),
        (ROOTS_TIER, ((100, signal.SIGINT),), 40),
    ]


def test_tiers_apply_only_to_their_own_targets_tree() -> None:
    specs = {100: (TierSpec("x", pattern="python"),)}
    tiers = plan([member(100, 0), member(101, 1), member(201, 1, root=200),
                  member(200, 0, root=200)], specs)
    assert [(t.name, t.pids) for t in tiers] == [
        ("x", (101,)), ("depth-1", (201,)), (ROOTS_TIER, (100, 200))
    ]


def test_same_named_tiers_of_two_targets_run_together_with_the_longer_timeout() -> None:
    specs = {100: (TierSpec("s", pattern="sched", timeout_s=5),),
             200: (TierSpec("s", pattern="sched", timeout_s=7),)}
    tiers = plan([member(101, 1, cmd="sched"), member(201, 1, root=200, cmd="sched")], specs)
    assert [(t.name, t.pids, t.timeout_s) for t in tiers] == [("s", (101, 201), 7)]


def test_empty_and_unmatched_tiers_are_left_out() -> None:
    assert plan([]) == []
    specs = {100: (TierSpec("never", pattern="nomatch"),)}
    assert [t.name for t in plan([member(100, 0)], specs)] == [ROOTS_TIER]


def test_match_tier_takes_the_first_match() -> None:
    a, b = TierSpec("a", pattern="x"), TierSpec("b", roles=("r",))
    assert match_tier(member(1, 1, cmd="x", role="r"), (a, b)) is a
    assert match_tier(member(1, 1, role="r"), (a, b)) is b
    assert match_tier(member(1, 1), (a, b)) is None


@pytest.mark.parametrize(
    ("now", "started", "timeout", "deadline", "reserve", "expected"),
    [
        (0, 0, 10, 30, 2, 10),  # the tier's own timeout
        (25, 25, 10, 30, 2, 3),  # cut to the deadline minus the reserve
        (5, 0, 10, 30, 2, 5),  # a resumed tier keeps counting from its start
        (12, 0, 10, 30, 2, 0),  # a resumed tier already past its timeout
        (29, 29, 10, 30, 2, 0),  # inside the reserve: no graceful time at all
    ],
)
def test_graceful_wait(now: float, started: float, timeout: float, deadline: float,
                       reserve: float, expected: float) -> None:
    """The last tier (nothing after it) gets its timeout, cut to what is left."""
    assert allotted_wait_s(now=now, tier_started_at=started, timeout_s=timeout,
                           deadline_at=deadline, reserve_s=reserve) == pytest.approx(expected)


def test_the_last_tier_keeps_half_of_the_usable_time_up_to_its_timeout() -> None:
    assert last_tier_reserve_s(usable_s=8, last_timeout_s=10) == 4
    assert last_tier_reserve_s(usable_s=30, last_timeout_s=10) == 10
    assert last_tier_reserve_s(usable_s=-1, last_timeout_s=10) == 0


def test_a_stubborn_tier_leaves_the_main_process_its_reserve() -> None:
    """The SGLang-shaped case: budget 10 s, confirm reserve 2 s, tiers depth-2, depth-1
    (with a child that ignores SIGTERM), roots; every tier's timeout is 10 s.

    1. depth-2 starts at 0: it shares what the roots do not keep with depth-1.
    2. depth-1 starts at 0.1 (depth-2 exited at once) and times out on its stubborn child.
    3. the roots start once depth-1 is SIGKILLed and still get their reserve.
    """
    reserve = last_tier_reserve_s(usable_s=8, last_timeout_s=10)
    depth2 = allotted_wait_s(now=0, tier_started_at=0, timeout_s=10, deadline_at=10,
                             reserve_s=2, later_timeouts=[10, 10], last_reserve_s=reserve)
    assert depth2 == pytest.approx(2)  # (8 - 4) shared by depth-2 and depth-1
    depth1 = allotted_wait_s(now=0.1, tier_started_at=0.1, timeout_s=10, deadline_at=10,
                             reserve_s=2, later_timeouts=[10], last_reserve_s=reserve)
    assert depth1 == pytest.approx(3.9)
    roots = allotted_wait_s(now=0.1 + depth1, tier_started_at=0.1 + depth1, timeout_s=10,
                            deadline_at=10, reserve_s=2)
    assert roots == pytest.approx(reserve)


def test_the_main_processes_tier_is_the_first_that_holds_a_root() -> None:
    """The roots' tier, last by default; a declared ``include_root`` tier that matched the
    root in its place (SGLang's profile: the main process first, its children after)."""
    default = plan([member(100, 0), member(101, 1)])
    assert [t.holds_roots for t in default] == [False, True]
    assert main_tier_index(default) == 1
    root_first = plan([member(100, 0, cmd="python -m sglang.launch_server"), member(101, 1)],
                      {100: (TierSpec(name="sglang-root", pattern="sglang", include_root=True,
                                      timeout_s=30),)})
    assert [(t.name, t.holds_roots) for t in root_first] == [
        ("sglang-root", True), ("depth-1", False)]
    assert main_tier_index(root_first) == 0
    assert main_tier_index(plan([member(101, 1), member(102, 2)])) == 1  # the roots are gone


def test_a_root_first_tier_waits_for_its_main_process_until_the_deadline() -> None:
    """SGLang as the issue measured it: grace 30 s, the kill's deadline 11.7 s, its SIGKILL
    reserve 2 s; the main process alone first (tier timeout 30 s), its children after (10 s).

    Before: the children's tier, last in the plan, kept half the usable time, and the main
    process got SIGKILL about 5 s after its SIGTERM with 7 s of the budget unused. Now the
    tiers after the main processes' keep nothing from it (``main_tier_index``: the kill passes
    only the tiers up to it as ``later_timeouts``): it waits until the deadline less the
    reserve."""
    plan_ = [PlannedTier("sglang-root", 30, ((100, signal.SIGTERM),), holds_roots=True),
             PlannedTier("depth-1", 10, ((101, signal.SIGTERM),))]
    main = main_tier_index(plan_)
    later = [t.timeout_s for t in plan_[1:main + 1]]
    reserve = last_tier_reserve_s(usable_s=11.7 - 2, last_timeout_s=plan_[main].timeout_s)
    wait = allotted_wait_s(now=0, tier_started_at=0, timeout_s=30, deadline_at=11.7,
                           reserve_s=2, later_timeouts=later, last_reserve_s=reserve)
    assert wait == pytest.approx(9.7)
    before = allotted_wait_s(now=0, tier_started_at=0, timeout_s=30, deadline_at=11.7,
                             reserve_s=2, later_timeouts=[10],
                             last_reserve_s=last_tier_reserve_s(usable_s=9.7,
                                                                last_timeout_s=10))
    assert before == pytest.approx(4.85)


@pytest.mark.parametrize(
    ("left", "later", "last_reserve", "expected"),
    [
        (8, [], 4, 0),  # the last tier keeps nothing back
        (8, [10], 4, 4),  # only the last tier after this one
        (8, [10, 10], 4, 6),  # one tier between: half of the 4 s the last does not keep
        (8, [1, 10], 4, 5),  # a short tier between keeps only its own timeout
        (8, [10, 10, 10, 10], 4, 7),  # three between: each a quarter of 4 s
        (3, [10, 10], 4, 4),  # less left than the reserve: the reserve still stands
    ],
)
def test_kept_for_later(left: float, later: list[float], last_reserve: float,
                        expected: float) -> None:
    assert kept_for_later_s(left_s=left, later_timeouts=later,
                            last_reserve_s=last_reserve) == pytest.approx(expected)


def test_a_tier_gets_nothing_once_the_last_tiers_reserve_is_all_that_is_left() -> None:
    assert allotted_wait_s(now=6, tier_started_at=6, timeout_s=10, deadline_at=10,
                           reserve_s=2, later_timeouts=[10], last_reserve_s=4) == 0


def test_every_tier_gets_a_positive_wait_while_time_is_left() -> None:
    """However many tiers follow, the current one shares fairly: never starved to zero."""
    for count in range(1, 12):
        wait = allotted_wait_s(now=0, tier_started_at=0, timeout_s=10, deadline_at=20,
                               reserve_s=2, later_timeouts=[10] * count, last_reserve_s=9)
        assert wait > 0


def test_confirm_reserve_and_wait() -> None:
    assert confirm_reserve(30, 2) == 2
    assert confirm_reserve(5, 2) == 1  # never more than a fifth of a short budget
    assert confirm_wait_s(now=0, deadline_at=30, confirm_s=2) == 2
    assert confirm_wait_s(now=29.5, deadline_at=30, confirm_s=2) == 0.5
    assert confirm_wait_s(now=31, deadline_at=30, confirm_s=2) == 0
    # A tier's SIGKILL confirmation cannot eat what the later tiers keep.
    assert confirm_wait_s(now=0, deadline_at=30, confirm_s=2, kept_s=29) == 1
    assert confirm_wait_s(now=0, deadline_at=30, confirm_s=2, kept_s=31) == 0


def test_a_tier_that_opts_in_holds_the_root_in_its_place() -> None:
    specs = {100: (TierSpec("main", pattern="launch_server", include_root=True, timeout_s=30),
                   TierSpec("schedulers", pattern="scheduler", timeout_s=5))}
    tiers = plan([member(100, 0, cmd="-m sglang.launch_server"),
                  member(101, 1, cmd="sglang::scheduler"), member(102, 1)], specs)
    assert [(t.name, t.pids, t.timeout_s) for t in tiers] == [
        ("main", (100,), 30), ("schedulers", (101,), 5), ("depth-1", (102,), 10)]


def test_include_root_does_not_move_a_root_the_tier_does_not_match() -> None:
    specs = {100: (TierSpec("main", pattern="launch_server", include_root=True),),
             200: (TierSpec("main", pattern="launch_server", include_root=True),)}
    tiers = plan([member(100, 0, cmd="launch_server"), member(200, 0, root=200, cmd="other"),
                  member(201, 1, root=200, cmd="launch_server")], specs)
    assert [(t.name, t.pids) for t in tiers] == [("main", (100, 201)), (ROOTS_TIER, (200,))]
