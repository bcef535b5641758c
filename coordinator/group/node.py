"""One coordinator's part in its group: the leader's book or the follower's link, the
budget, the ports handed to the drain controller, what ``/status`` shows and the state file
keeps. The coordinator builds one (``GroupNode.build``) when it is in a group, and none
otherwise."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from coordinator.drain.controller import DrainController
from coordinator.drain.phases import Phase, PhaseMachine
from coordinator.drain.ports import Fleet, Killer
from coordinator.drain.record import DrainRecord
from coordinator.group.budget import GroupBudget, group_budget
from coordinator.group.follower import FollowerLink
from coordinator.group.leader import LeaderBook, MemberEntry
from coordinator.group.membership import GroupSettings, Membership, membership
from coordinator.group.peer import LeaderClient
from coordinator.group.ports import EngineFirstKiller, GatedKiller, GroupFleet
from coordinator.group.summary import MODE_GROUP
from coordinator.group.table import FollowerState

log = logging.getLogger(__name__)


class NodeSettings(GroupSettings, Protocol):
    """The settings a group node reads (``coordinator.settings.Settings``)."""

    group_leader_timeout_s: float
    group_follower_share: float
    group_engine_first: bool
    tier_timeout_s: float
    confirm_s: float


class ControllerHost:
    """The coordinator as the follower's link sees it (the controller is attached once it
    is built, after the ports it is given)."""

    def __init__(self, machine: PhaseMachine, changed: Callable[[], None]) -> None:
        self.machine = machine
        self._changed = changed
        self.controller: DrainController | None = None

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    def current_drain(self) -> DrainRecord | None:
        return self.controller.drain if self.controller is not None else None

    def start_drain(self, reason: str) -> None:
        if self.controller is not None:
            self.controller.start(reason)

    def abort_drain(self) -> None:
        if self.controller is not None:
            self.controller.abort()

    def changed(self) -> None:
        self._changed()


class GroupNode:
    """See the module docstring."""

    def __init__(self, membership: Membership, budget: GroupBudget, settings: NodeSettings,
                 host: ControllerHost, token: str | None) -> None:
        self.membership = membership
        self.budget = budget
        self.settings = settings
        self.host = host
        self.leader: LeaderBook | None = None
        self.follower: FollowerLink | None = None
        if membership.is_leader:
            self.leader = LeaderBook(membership, host.changed)
        else:
            self.follower = FollowerLink(
                membership, budget, LeaderClient(membership.leader_url, token), host,
                leader_timeout_s=settings.group_leader_timeout_s)

    @classmethod
    def build(cls, settings: NodeSettings, environ: Mapping[str, str], budget_s: float,
              host: ControllerHost, token: str | None) -> GroupNode | None:
        """The node of a coordinator in a group; None when it is in none
        (``GroupSettingError`` when the group settings contradict each other)."""
        found = membership(settings, environ)
        if found is None:
            return None
        budget = group_budget(budget_s, confirm_s=settings.confirm_s,
                              follower_share=settings.group_follower_share)
        return cls(found, budget, settings, host, token)

    def token_changed(self, token: str) -> None:
        """The token file changed: the calls to the leader carry the new token."""
        if self.follower is not None:
            self.follower.client.set_token(token)

    @property
    def drain_budget_s(self) -> float:
        """This member's own drain budget: the leader's is cut to leave the followers
        their kill (``budget.py``); a follower's is the whole."""
        return self.budget.leader_s if self.membership.is_leader else self.budget.total_s

    # --- the ports ---------------------------------------------------------------------

    def fleet(self, inner: Fleet) -> Fleet:
        gate = self.follower.gate if self.follower is not None else None
        return GroupFleet(inner, gate=gate, started=self.drain_started)

    def killer(self, inner: Killer) -> Killer:
        if self.follower is not None:
            follower = self.follower
            return GatedKiller(inner, follower.gate, lambda: follower.open_gate(
                "a force drain does not wait for the leader"))
        if self.settings.group_engine_first:
            return EngineFirstKiller(inner, self.settings.tier_timeout_s)
        return inner

    # --- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        if self.follower is not None:
            self.follower.start()

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()

    def drain_started(self, drain: DrainRecord) -> None:
        if self.leader is not None:
            self.leader.new_drain()
        if self.follower is not None:
            self.follower.drain_started(drain)

    def drain_finished(self, drain: DrainRecord) -> None:
        if self.follower is not None:
            self.follower.drain_finished(drain)

    def new_cycle(self) -> None:
        if self.follower is not None:
            self.follower.new_cycle()

    # --- what the others see -----------------------------------------------------------

    def summary(self) -> dict[str, Any] | None:
        """The group summary (the leader's own; the leader's, as fetched, on a follower)."""
        if self.leader is not None:
            drain = self.host.current_drain()
            return self.leader.summary(drain, self.host.phase)
        assert self.follower is not None
        return self.follower.summary

    def leader_document(self, instance: str, generation: int) -> dict[str, Any]:
        """``GET /group`` on the leader."""
        assert self.leader is not None
        return self.leader.document(instance=instance, phase=self.host.phase,
                                    generation=generation, drain=self.host.current_drain())

    def settled(self) -> bool:
        """A blocking drain call has nothing more to wait for: the group summary is
        complete (or this follower drained on its own)."""
        if self.follower is not None:
            return self.follower.settled()
        summary = self.summary()
        return bool(summary and summary.get("complete"))

    def settle_by(self, drain: DrainRecord) -> float:
        """Epoch seconds until which a blocking drain call may wait for ``settled``."""
        return drain.deadlines.started_at + self.budget.total_s

    async def wait_settled(self, drain: DrainRecord, changes: Any, clock: Callable[[], float]
                           ) -> None:
        """Wait until ``settled()`` or ``settle_by(drain)`` (``changes``: the coordinator's
        change signal)."""
        until = self.settle_by(drain)
        while not self.settled():
            left = until - clock()
            if left <= 0:
                return
            await changes.wait(min(left, 1.0))

    def to_status(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            **self.membership.to_status(),
            "budget_s": self.budget.total_s,
            "follower_kill_s": self.budget.follower_kill_s,
        }
        if self.leader is not None:
            document.update(mode=MODE_GROUP, reason=None,
                            members=[e.to_status() for _, e in
                                     sorted(self.leader.members.items())],
                            summary=self.summary())
        else:
            assert self.follower is not None
            document.update(self.follower.to_status())
        return document

    def to_record(self) -> dict[str, Any]:
        if self.leader is not None:
            return {"index": self.membership.index, **self.leader.to_record()}
        assert self.follower is not None
        return {"index": self.membership.index, **self.follower.to_record()}

    def restore(self, record: dict[str, Any] | None) -> None:
        """Take over what the state file kept (a record of another index is ignored)."""
        if not record or record.get("index") != self.membership.index:
            return
        if self.leader is not None:
            self.leader.restore(record)
        elif self.follower is not None:
            self.follower.restore(record)


def check_record(record: Any) -> None:
    """Raise ``ValueError`` (or ``KeyError``/``TypeError``) unless ``record`` is a group
    record a node can restore: a state file is restored whole or set aside."""
    if record is None:
        return
    if not isinstance(record, dict) or not isinstance(record.get("index"), int):
        raise ValueError("group: expected an object with an integer index")
    if "state" in record:
        FollowerState(record["state"])
    for member in record.get("members") or ():
        MemberEntry.from_record(member)
