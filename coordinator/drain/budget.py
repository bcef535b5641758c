"""Pure arithmetic of the drain's one time budget. No clocks, no sleeping.

    budget      = grace period - safety margin        (an operator's deadline_s only shortens it)
    termination = max(share * budget, one tier + SIGKILL confirmation), but never more than
                  3/4 of the budget, so even a short budget leaves workers time to hand back;
                  "one tier" is the longer of the default tier timeout and the time the
                  engine's main process needs to exit after its graceful signal (its
                  profile's ``main_exit_s``: SGLang's, measured, is longer than a tier)
    migration   = budget - termination                (draining + migrating)
    min drain   = --min-drain, cut to the migration share

The termination share is sized first because a kill cut short leaves processes ``survived``,
while a migration cut short only hands a few more requests back late.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TERMINATION_FRACTION = 0.75
"""Termination never takes more of the budget than this (the kill engine cuts its tier timeouts
to the deadline it is given; migration with no time at all would lose every in-flight request)."""

MIN_BUDGET_S = 1.0
"""Floor of a budget: a drain always gets at least this long, even with a huge margin."""


@dataclass(frozen=True)
class BudgetSplit:
    """How one drain's seconds are spent, relative to its start."""

    total_s: float
    migration_s: float
    termination_s: float
    min_drain_s: float


@dataclass(frozen=True)
class Deadlines:
    """A split anchored at the drain's start (epoch seconds, so it survives a restart)."""

    started_at: float
    min_drain_until: float
    migration_deadline_at: float
    deadline_at: float


def total_budget(grace_period_s: float, safety_margin_s: float) -> float:
    """The default budget: the grace period less the safety margin (never below the floor)."""
    return max(MIN_BUDGET_S, grace_period_s - safety_margin_s)


def effective_budget(default_s: float, requested_s: float | None) -> float:
    """A per-drain ``deadline_s`` can only shorten the default budget."""
    if requested_s is None or requested_s <= 0:
        return default_s
    return min(default_s, requested_s)


def split_budget(
    total_s: float,
    *,
    tier_timeout_s: float,
    confirm_s: float,
    termination_share: float = 0.4,
    min_drain_s: float = 0.0,
    main_exit_s: float = 0.0,
) -> BudgetSplit:
    """Split ``total_s`` between migration and termination (see the module docstring)."""
    reserve = max(tier_timeout_s, main_exit_s) + confirm_s
    termination = max(
        termination_share * total_s, min(reserve, MAX_TERMINATION_FRACTION * total_s)
    )
    termination = min(total_s, termination)
    migration = max(0.0, total_s - termination)
    return BudgetSplit(
        total_s=total_s,
        migration_s=migration,
        termination_s=termination,
        min_drain_s=min(max(0.0, min_drain_s), migration),
    )


def anchor(split: BudgetSplit, started_at: float) -> Deadlines:
    """Absolute deadlines of a drain that started at ``started_at``."""
    return Deadlines(
        started_at=started_at,
        min_drain_until=started_at + split.min_drain_s,
        migration_deadline_at=started_at + split.migration_s,
        deadline_at=started_at + split.total_s,
    )


def remaining(deadline_at: float, now: float) -> float:
    """Seconds left until ``deadline_at`` (0 when past)."""
    return max(0.0, deadline_at - now)


def too_short_for_a_tier(split: BudgetSplit, *, tier_timeout_s: float) -> str | None:
    """A warning when the whole budget is shorter than one kill tier's timeout, else None:
    even a kill given all of it cannot give a single tier its wait, so processes get a
    fraction of what they were meant to have between their graceful signal and SIGKILL."""
    if split.total_s >= tier_timeout_s:
        return None
    return (f"the drain's budget is {split.total_s:g}s ({split.migration_s:g}s to migrate, "
            f"{split.termination_s:g}s to terminate), shorter than one kill tier's timeout "
            f"({tier_timeout_s:g}s): processes get a fraction of it between their graceful "
            "signal and SIGKILL; raise --grace-period (the pod's "
            "terminationGracePeriodSeconds) or lower --safety-margin")
