"""The group wired into the drain controller through its own ports, ``Fleet`` and
``Killer``; the controller itself knows nothing of groups.

    GroupFleet     a follower's migration is settled only once its kill may run (so its
                   workers are told ``terminate`` after the leader's engine stopped); every
                   member's drain start and end reach the group (forwarded, reported)
    GatedKiller    a follower's kill waits at the gate (the leader's engine stopped, its
                   share of the budget over, or the leader lost), then runs with the time
                   left; a force drain opens the gate at once
    EngineFirstKiller   the leader's kill signals its engine's main processes first, in a
                   tier of their own: a multi-node engine's leader stops issuing steps and
                   stops its ranks in the order its collectives allow (children first would
                   stop rank 0 under a front end that may still issue a step)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from coordinator.drain.ports import Fleet, Killer
from coordinator.kill.policy import KillPolicy, Target, TierSpec
from coordinator.kill.report import KillReport
from coordinator.kill.table import HandRoots, OnUpdate, PriorOutcomes

if TYPE_CHECKING:
    import asyncio

    from coordinator.drain.record import DrainRecord

ENGINE_TIER = "group-engine"
ENGINE_ROLES = ("worker", "adopted")
"""The roles of an engine's main processes: registered (``worker_client``'s default) or
adopted."""


class GroupFleet:
    """A ``Fleet`` that tells the group of the drain and (on a follower) holds migration
    until the kill may run."""

    def __init__(self, inner: Fleet, *, gate: asyncio.Event | None,
                 started: Callable[[DrainRecord], None]) -> None:
        self.inner = inner
        self.gate = gate
        self.started = started

    def drain_started(self, drain: DrainRecord) -> None:
        self.inner.drain_started(drain)
        self.started(drain)

    def drain_aborted(self) -> None:
        self.inner.drain_aborted()

    def terminating(self, drain: DrainRecord) -> list[str]:
        return self.inner.terminating(drain)

    def migration_settled(self) -> bool:
        held = self.gate is not None and not self.gate.is_set()
        return not held and self.inner.migration_settled()

    def prekill_settled(self, worker_ids: list[str]) -> bool:
        return self.inner.prekill_settled(worker_ids)

    def kill_targets(self) -> list[Target]:
        return self.inner.kill_targets()

    def budget_ended(self) -> None:
        self.inner.budget_ended()

    def lost_requests(self, drain: DrainRecord) -> int:
        return self.inner.lost_requests(drain)

    def cut_requests(self, drain: DrainRecord) -> int:
        return self.inner.cut_requests(drain)

    def persist(self, now: bool = False) -> Awaitable[None] | None:
        return self.inner.persist(now)


class GatedKiller:
    """A follower's ``Killer``: the kill waits at the gate first."""

    def __init__(self, inner: Killer, gate: asyncio.Event, open_gate: Callable[[], None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.gate = gate
        self.open_gate = open_gate
        self.monotonic = monotonic
        self._force = False
        self._running = False

    async def run(self, targets: Iterable[Target], policy: KillPolicy | None = None, *,
                  on_update: OnUpdate | None = None, prior: PriorOutcomes | None = None,
                  hand_roots: HandRoots | None = None) -> KillReport:
        began = self.monotonic()
        if policy is not None and policy.force:
            self.open_gate()  # a force drain waits for nobody
        await self.gate.wait()
        if policy is not None:
            waited = self.monotonic() - began
            policy = dataclasses.replace(policy, deadline_s=max(0.1, policy.deadline_s - waited),
                                         force=policy.force or self._force)
        self._running = True
        try:
            return await self.inner.run(targets, policy, on_update=on_update, prior=prior,
                                        hand_roots=hand_roots)
        finally:
            self._running = False

    def escalate(self) -> bool:
        if self._running:
            return self.inner.escalate()
        self._force = True
        self.open_gate()
        return True


class EngineFirstKiller:
    """The leader's ``Killer``: its engine's main processes get the first tier."""

    def __init__(self, inner: Killer, timeout_s: float) -> None:
        self.inner = inner
        self.tier = TierSpec(name=ENGINE_TIER, roles=ENGINE_ROLES, timeout_s=timeout_s,
                             include_root=True)

    async def run(self, targets: Iterable[Target], policy: KillPolicy | None = None, *,
                  on_update: OnUpdate | None = None, prior: PriorOutcomes | None = None,
                  hand_roots: HandRoots | None = None) -> KillReport:
        policy = policy or KillPolicy()
        policy = dataclasses.replace(policy, extra_tiers=(self.tier, *policy.extra_tiers))
        return await self.inner.run(targets, policy, on_update=on_update, prior=prior,
                                    hand_roots=hand_roots)

    def escalate(self) -> bool:
        return self.inner.escalate()
