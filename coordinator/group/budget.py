"""Pure arithmetic of a group's one budget. No clocks.

Every member of a group gets its grace period at the same moment (a group deletion runs
every pod's preStop hook at once), and every member is configured alike, so each has the
same budget ``B = grace period - safety margin``. The leader's drain must leave the
followers time to stop what is left of their ranks after its engine stopped:

    R (followers' kill) = max(share * B, confirm + 1 s), at most B / 2
    leader's drain      = B - R      migration and its own kill, split as for one pod
    follower's gate     = start + B - R   its kill waits for the leader's engine until then
    follower's kill     = until start + B (R seconds at least)

Defaults (30 s grace, 5 s margin, share 0.25): B = 25 s, R = 6.25 s; the leader drains in
18.75 s (11.25 s migration, 7.5 s kill); a follower's kill runs once the leader's engine
stopped, or at 18.75 s at the latest, and ends by 25 s.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_FOLLOWER_KILL_S = 1.0
"""Beyond the SIGKILL confirmation, a follower's kill always keeps this long for a graceful
signal and a wait."""


@dataclass(frozen=True)
class GroupBudget:
    """One member's budget seen from the group."""

    total_s: float
    """``B``: the pod's budget."""
    follower_kill_s: float
    """``R``: what the followers' kills keep after the leader's engine stopped."""

    @property
    def leader_s(self) -> float:
        """The leader's drain budget: ``B - R``."""
        return self.total_s - self.follower_kill_s

    def gate_at(self, started_at: float) -> float:
        """When a follower whose drain started at ``started_at`` stops waiting for the
        leader's engine."""
        return started_at + self.leader_s


def group_budget(total_s: float, *, confirm_s: float, follower_share: float) -> GroupBudget:
    """Split ``total_s`` between the leader's drain and the followers' kills."""
    reserve = max(follower_share * total_s, confirm_s + MIN_FOLLOWER_KILL_S)
    return GroupBudget(total_s=total_s, follower_kill_s=min(reserve, total_s / 2))
