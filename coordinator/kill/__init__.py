"""Ordered graceful kill of process trees (a library; usable without the HTTP service).

    report = await terminate([Target(pid, start_time)], KillPolicy(deadline_s=25))

See docs/kill-engine.md for the steps, the guarantees and the fallbacks.
"""

from coordinator.kill.engine import Terminator, terminate
from coordinator.kill.policy import KillPolicy, Target, TierSpec
from coordinator.kill.report import Fate, KillReport, ProcessOutcome
from coordinator.kill.table import OnUpdate, PriorOutcomes

__all__ = [
    "Fate",
    "KillPolicy",
    "KillReport",
    "OnUpdate",
    "PriorOutcomes",
    "ProcessOutcome",
    "Target",
    "Terminator",
    "TierSpec",
    "terminate",
]
