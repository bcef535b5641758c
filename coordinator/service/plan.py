"""The kill as it would run now: the tiers the kill engine would form from the processes the
last scan listed, in order, with each tier's signal, timeout and the time the drain's budget
would really give it (``GET /plan``, ``shutdown-coordinator status --plan``).

It is planned by the kill engine's own ``plan_tiers`` from the same tiers the drain gives it
(each worker's declared tiers; ``--adopt-tier`` for adopted trees). The drain re-discovers the
processes when it starts (forks, restarts), so the real kill may hold more or fewer.

A tier's timeout is the most it ever waits; the drain's budget decides what it gets
(``coordinator/kill/tiers.py``): ``wait_s`` gives, for the budget of a drain started now,
the least (the kill starts at the migration deadline, after the pre-kill hooks' whole
timeout when workers are registered, and every tier before it waits all it may) and the
most (nothing to migrate beyond ``--min-drain``, every process before it exits at its
signal). A budget shorter than one tier's timeout is warned of (``warnings``), as ``serve``
warns of it at start.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from coordinator.drain.budget import BudgetSplit, split_budget, too_short_for_a_tier
from coordinator.drain.record import DrainConfig
from coordinator.kill.policy import TierSpec
from coordinator.kill.tiers import Member, plan_tiers, planned_waits

if TYPE_CHECKING:
    from coordinator.service.runtime import Coordinator


def kill_plan(coordinator: Coordinator) -> dict[str, Any]:
    """``{"tiers": [{"tier", "timeout_s", "wait_s": {"least", "most"}, "processes": [{"pid",
    "name", "role", "signal", "cmdline"}]}], "processes": N, "budget": {...}, "warnings":
    [...]}`` for the processes listed now."""
    settings = coordinator.settings
    specs: dict[int, tuple[TierSpec, ...]] = {
        found.pid: tuple(settings.adopt_tiers) for found in coordinator.scan.adopted}
    specs.update((w.pid, w.tiers) for w in coordinator.registry.alive())
    listed = {o.pid: o for o in coordinator.scan.scanned.values()}
    members = [Member(pid=o.pid, parent_pid=o.parent_pid, depth=o.depth, name=o.name,
                      cmdline=o.cmdline, role=o.role,
                      root_pid=o.pid if o.root_pid is None else o.root_pid)
               for o in listed.values()]
    planned = plan_tiers(members, specs, default_signal=int(signal.SIGTERM),
                         default_timeout_s=settings.tier_timeout_s)
    config = coordinator.controller.config
    split = drain_split(config)
    kill = kill_window(split, config, workers=bool(coordinator.registry.alive()))
    timeouts = [tier.timeout_s for tier in planned]
    least = planned_waits(timeouts, deadline_s=kill[0], confirm_s=config.confirm_s,
                          stubborn=True)
    most = planned_waits(timeouts, deadline_s=kill[1], confirm_s=config.confirm_s,
                         stubborn=False)
    return {
        "processes": len(members),
        "budget": {"budget_s": split.total_s, "migration_s": split.migration_s,
                   "termination_s": split.termination_s, "min_drain_s": split.min_drain_s,
                   "kill_least_s": kill[0], "kill_most_s": kill[1]},
        "warnings": [w for w in (too_short_for_a_tier(
            split, tier_timeout_s=config.tier_timeout_s),) if w],
        "tiers": [{
            "tier": tier.name,
            "timeout_s": tier.timeout_s,
            "wait_s": {"least": round(low, 3), "most": round(high, 3)},
            "processes": [{
                "pid": pid, "name": listed[pid].name, "role": listed[pid].role,
                "depth": listed[pid].depth, "signal": signal.Signals(sig).name,
                "cmdline": listed[pid].cmdline[:160]}
                for pid, sig in tier.signals],
        } for tier, low, high in zip(planned, least, most, strict=True)],
    }


def drain_split(config: DrainConfig) -> BudgetSplit:
    """The split of a drain started now with the coordinator's own budget."""
    return split_budget(config.budget_s, tier_timeout_s=config.tier_timeout_s,
                        confirm_s=config.confirm_s, termination_share=config.termination_share,
                        min_drain_s=config.min_drain_s)


def kill_window(split: BudgetSplit, config: DrainConfig, *,
                workers: bool) -> tuple[float, float]:
    """(least, most) seconds the kill's deadline gives it: it starts at the migration
    deadline at the latest, after the pre-kill hooks (only registered workers have them),
    and at ``--min-drain`` at the earliest."""
    hooks = min(config.prekill_timeout_s, split.termination_s) if workers else 0.0
    return (max(0.1, split.termination_s - hooks),
            max(0.1, split.total_s - split.min_drain_s))
