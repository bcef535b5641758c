"""The budget arithmetic, as pure functions: no clock, no sleeping."""

from __future__ import annotations

import pytest

from coordinator.drain.budget import (
    MIN_BUDGET_S,
    anchor,
    effective_budget,
    remaining,
    split_budget,
    total_budget,
)


def test_default_budget_is_grace_period_minus_margin() -> None:
    assert total_budget(30, 5) == 25
    assert total_budget(2, 5) == MIN_BUDGET_S


@pytest.mark.parametrize(("requested", "expected"), [
    (None, 25.0), (10.0, 10.0), (25.0, 25.0), (99.0, 25.0), (0.0, 25.0), (-3.0, 25.0)])
def test_a_drain_deadline_only_shortens(requested: float | None, expected: float) -> None:
    assert effective_budget(25.0, requested) == expected


def test_termination_share_fits_a_tier_and_confirmation() -> None:
    split = split_budget(25, tier_timeout_s=10, confirm_s=2, termination_share=0.4)
    assert split.termination_s == 12
    assert split.migration_s == 13
    assert split.migration_s + split.termination_s == split.total_s


def test_large_budget_uses_the_share() -> None:
    split = split_budget(100, tier_timeout_s=10, confirm_s=2, termination_share=0.4)
    assert split.termination_s == 40
    assert split.migration_s == 60


def test_short_budget_still_leaves_time_to_hand_back() -> None:
    split = split_budget(4, tier_timeout_s=10, confirm_s=2, termination_share=0.4)
    assert split.termination_s == 3
    assert split.migration_s == 1


def test_min_drain_is_cut_to_the_migration_share() -> None:
    assert split_budget(25, tier_timeout_s=10, confirm_s=2, min_drain_s=5).min_drain_s == 5
    assert split_budget(25, tier_timeout_s=10, confirm_s=2, min_drain_s=60).min_drain_s == 13
    assert split_budget(25, tier_timeout_s=10, confirm_s=2, min_drain_s=-1).min_drain_s == 0


def test_deadlines_are_anchored_at_the_start() -> None:
    split = split_budget(25, tier_timeout_s=10, confirm_s=2, min_drain_s=3)
    deadlines = anchor(split, 1000.0)
    assert deadlines.min_drain_until == 1003.0
    assert deadlines.migration_deadline_at == 1013.0
    assert deadlines.deadline_at == 1025.0
    assert remaining(deadlines.deadline_at, 1020.0) == 5.0
    assert remaining(deadlines.deadline_at, 1030.0) == 0.0


def test_the_termination_share_fits_the_engines_main_exit() -> None:
    """SGLang at the default grace period (30 s - 5 s): its main process needs up to 15 s
    from SIGTERM to its exit (``main_exit_s``, measured), more than a 10 s tier, so
    termination gets 15 + 2 s of the 25 s and migration the 8 s left; with a budget long
    enough the share rules as before."""
    sglang = split_budget(25, tier_timeout_s=10, confirm_s=2, main_exit_s=15)
    assert (sglang.termination_s, sglang.migration_s) == (17, 8)
    assert split_budget(25, tier_timeout_s=10, confirm_s=2).termination_s == 12
    assert split_budget(115, tier_timeout_s=10, confirm_s=2, main_exit_s=15).termination_s == 46
