"""The kill as it would run now: the tiers the kill engine would form from the processes the
last scan listed, in order, with each tier's signal and timeout (``GET /plan``,
``shutdown-coordinator status --plan``).

It is planned by the kill engine's own ``plan_tiers`` from the same tiers the drain gives it
(each worker's declared tiers; ``--adopt-tier`` for adopted trees). The drain re-discovers the
processes when it starts (forks, restarts), so the real kill may hold more or fewer; each
tier's timeout is also cut to the budget left when it runs (``coordinator/kill/tiers.py``).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from coordinator.kill.policy import TierSpec
from coordinator.kill.tiers import Member, plan_tiers

if TYPE_CHECKING:
    from coordinator.service.runtime import Coordinator


def kill_plan(coordinator: Coordinator) -> dict[str, Any]:
    """``{"tiers": [{"tier", "timeout_s", "processes": [{"pid", "name", "role", "signal",
    "cmdline"}]}], "processes": N}`` for the processes listed now."""
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
    return {
        "processes": len(members),
        "tiers": [{
            "tier": tier.name,
            "timeout_s": tier.timeout_s,
            "processes": [{
                "pid": pid, "name": listed[pid].name, "role": listed[pid].role,
                "depth": listed[pid].depth, "signal": signal.Signals(sig).name,
                "cmdline": listed[pid].cmdline[:160]}
                for pid, sig in tier.signals],
        } for tier in planned],
    }
