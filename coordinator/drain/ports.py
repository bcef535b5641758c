"""What the drain controller needs from the rest of the coordinator, as two protocols: the
kill engine (``Killer``) and the workers' side of the service (``Fleet``)."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Protocol

from coordinator.kill.policy import KillPolicy, Target
from coordinator.kill.report import KillReport
from coordinator.kill.table import HandRoots, OnUpdate, PriorOutcomes

if TYPE_CHECKING:
    from coordinator.drain.record import DrainRecord


class Killer(Protocol):
    """The kill engine as the controller drives it (``coordinator.kill.Terminator``)."""

    async def run(self, targets: Iterable[Target], policy: KillPolicy | None = None, *,
                  on_update: OnUpdate | None = None, prior: PriorOutcomes | None = None,
                  hand_roots: HandRoots | None = None) -> KillReport:
        """Run one kill to its report."""

    def escalate(self) -> bool:
        """Switch the running kill to force mode now (False: no kill runs)."""


class Fleet(Protocol):
    """What the controller needs from the workers' side of the service."""

    def drain_started(self, drain: DrainRecord) -> None:
        """Mark workers draining and push the ``drain`` event (must not await)."""

    def drain_aborted(self) -> None:
        """Mark workers serving again and push ``abort``."""

    def terminating(self, drain: DrainRecord) -> list[str]:
        """Push ``terminate``; return the ids of workers whose ``prekill_done`` to wait for."""

    def migration_settled(self) -> bool:
        """Every worker reported zero in-flight since the drain started (or was not
        connected to hear of it, or disconnected, or exited; one that was connected when a
        restarted coordinator last saved its state has connected again) and every handoff
        is acknowledged."""

    def prekill_settled(self, worker_ids: list[str]) -> bool:
        """Every one of these workers reported ``prekill_done`` (or exited, or disconnected)."""

    def kill_targets(self) -> list[Target]:
        """Registered workers' roots plus adopted roots, discovered now."""

    def budget_ended(self) -> None:
        """The drain's budget is over (pending migrations expire)."""

    def lost_requests(self, drain: DrainRecord) -> int:
        """The drain is over: expire the handoffs still pending and return how many this
        drain lost in all (handed back, never acknowledged by a router)."""

    def cut_requests(self, drain: DrainRecord) -> int:
        """The kill is over: how many requests an engine that does not register still had in
        flight by its own count when its processes ended (0 when nothing reads its count)."""

    def persist(self, now: bool = False) -> Awaitable[None] | None:
        """Save the state (``now``: return an awaitable that completes once it is on disk)."""
