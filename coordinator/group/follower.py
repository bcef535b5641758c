"""A follower's link to its leader: it follows the leader's drain and holds its own kill
until the leader's engine has stopped. The states and moves are ``table.py``'s; this module
observes and acts.

    1. announce this member to the leader (``POST /group/members``), retried in the
       background, again whenever the leader stops listing it (it restarted afresh);
    2. long-poll the leader (``GET /group``): a leader that drains starts this pod's drain;
       a leader whose drain is done has stopped its engine: the kill may run; a leader back
       to serving (its drain aborted) aborts this pod's drain while nothing is signalled;
    3. this pod's own drain (its preStop hook, an operator) is forwarded to the leader
       (``POST /drain``, not waiting), so it becomes the group's; the kill gate closes and
       opens at the latest when the leader's share of the budget is over (``budget.py``);
    4. a leader that cannot be reached for ``leader_timeout_s`` after this pod's drain began
       (refused, reset, silent, 5xx or 4xx) is lost: the pod drains on its own (``local``,
       with the reason) and the gate opens;
    5. once this pod's drain is done its summary goes to the leader (retried, bounded), and
       the group summary the leader merges is shown here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from coordinator.drain.phases import Phase
from coordinator.drain.record import DrainRecord
from coordinator.errors import DrainConflict
from coordinator.group.budget import GroupBudget
from coordinator.group.membership import Membership
from coordinator.group.peer import GroupError, LeaderClient, retrying
from coordinator.group.summary import MODE_GROUP, MODE_LOCAL, own_report
from coordinator.group.table import (
    DRAINING_STATES,
    KILL_MAY_RUN,
    FollowerEvent,
    FollowerState,
    leader_lost,
    step,
)

log = logging.getLogger(__name__)

POLL_WAIT_S = 10.0
"""Each long-poll of the leader asks to be answered within this long."""
LEADER_DRAINING = frozenset({Phase.DRAINING, Phase.MIGRATING, Phase.TERMINATING})
"""The leader's phases that start a follower's drain. ``done`` does not: a follower that
comes up (or starts a new cycle) next to a leader whose drain ended long ago must not drain
again; a follower already draining is released by ``engine_stopped``."""


class Host(Protocol):
    """What the link needs of its coordinator."""

    @property
    def phase(self) -> Phase: ...

    def current_drain(self) -> DrainRecord | None: ...

    def start_drain(self, reason: str) -> None: ...

    def abort_drain(self) -> None: ...

    def changed(self) -> None: ...


class FollowerLink:
    """One follower's side of the group (see the module docstring)."""

    def __init__(self, membership: Membership, budget: GroupBudget, client: LeaderClient,
                 host: Host, *, leader_timeout_s: float,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.membership = membership
        self.budget = budget
        self.client = client
        self.host = host
        self.leader_timeout_s = leader_timeout_s
        self.clock = clock
        self.monotonic = monotonic
        self.state = FollowerState.JOINING
        self.mode = MODE_GROUP
        self.reason: str | None = None
        self.leader: dict[str, Any] | None = None
        """The leader's last ``GET /group`` answer."""
        self.reachable: bool | None = None
        self.last_error: str | None = None
        self.gate = asyncio.Event()
        self._unreachable_since: float | None = None
        self._drain_began: float | None = None
        """Monotonic time this pod's group drain began (the loss bound counts from it)."""
        self._leader_seen_draining = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._announcing: asyncio.Task[Any] | None = None
        self._gate_timer: asyncio.TimerHandle | None = None

    # --- the table ---------------------------------------------------------------------

    def open_gate(self, reason: str) -> None:
        """Let the kill run now (a force drain waits for nobody)."""
        self.fire(FollowerEvent.GATE_EXPIRED, reason)

    def fire(self, event: FollowerEvent, reason: str | None = None) -> bool:
        """Apply ``event``; True when the state changed."""
        new = step(self.state, event)
        if new is None:
            return False
        log.info("group member %d: %s → %s (%s)", self.membership.index, self.state, new,
                 reason or event)
        self.state = new
        if new is FollowerState.LOCAL:
            self.mode, self.reason = MODE_LOCAL, reason
        elif new is FollowerState.RELEASED:
            self.reason = reason
        elif new in (FollowerState.JOINING, FollowerState.JOINED):
            self.mode, self.reason = MODE_GROUP, None
            self._drain_began = None
            self._leader_seen_draining = False
        if new in KILL_MAY_RUN:
            self.gate.set()
        else:
            self.gate.clear()
        self.host.changed()
        return True

    # --- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._follow(), "group-follow")
        self._announce_soon()

    async def stop(self) -> None:
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- step 1: announce --------------------------------------------------------------

    def _announce_soon(self) -> None:
        if self._announcing is None or self._announcing.done():
            self._announcing = self._spawn(self._announce(), "group-announce")

    async def _announce(self) -> None:
        index, url = self.membership.index, self.membership.own_url
        while True:
            try:
                async for attempt in retrying(3600.0):
                    with attempt:
                        await self.client.announce(index, url)
            except GroupError as exc:  # refused (4xx): say so, try again later
                self._failed(exc)
                await asyncio.sleep(1.0)
                continue
            self.fire(FollowerEvent.ANNOUNCED)
            return

    # --- step 2 and 4: follow the leader -----------------------------------------------

    async def _follow(self) -> None:
        since: int | None = None
        instance: str | None = None
        failures = 0
        while True:
            began = self.monotonic()
            try:
                doc = await self.client.watch(since, POLL_WAIT_S)
            except GroupError as exc:
                self._failed(exc, began)
                failures += 1
                await asyncio.sleep(min(1.0, 0.1 * 2 ** min(failures, 4)))
                continue
            failures = 0
            if doc.get("instance") != instance:
                instance, since = doc.get("instance"), None
            generation = doc.get("generation")
            since = generation if isinstance(generation, int) else None
            self._reached(doc)

    def _failed(self, exc: Exception, began: float | None = None) -> None:
        """A call failed (``began``: when it was made; unreachable since then)."""
        now = self.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now if began is None else began
        changed = self.reachable is not False or self.last_error != str(exc)
        if self.reachable is not False:
            log.warning("group member %d: the leader %s cannot be reached: %s",
                        self.membership.index, self.client.leader_url, exc)
        self.reachable, self.last_error = False, str(exc)
        if self.state is FollowerState.DRAINING and self._drain_began is not None:
            since = max(self._unreachable_since, self._drain_began)
            if leader_lost(since, now, self.leader_timeout_s):
                self.fire(FollowerEvent.LEADER_LOST,
                          f"the leader {self.client.leader_url} could not be reached for "
                          f"{self.leader_timeout_s:g} s ({exc}): this pod drained on its own")
                self._drain_locally()
                return
        if changed:
            self.host.changed()

    def _reached(self, doc: dict[str, Any]) -> None:
        seen = _visible(self.leader), self.reachable
        self._unreachable_since = None
        self.reachable, self.last_error = True, None
        self.leader = doc
        listed = {m.get("index") for m in doc.get("members") or () if isinstance(m, dict)}
        if self.membership.index not in listed:
            self._announce_soon()
        try:
            phase: Phase | None = Phase(str(doc.get("phase")))
        except ValueError:
            phase = None
        if phase in LEADER_DRAINING:
            self._leader_seen_draining = True
            if self.fire(FollowerEvent.LEADER_DRAINING):
                self._began()
            if self.host.phase is Phase.SERVING and self.state in DRAINING_STATES:
                self.host.start_drain("group: the leader is draining")
        if doc.get("engine_stopped") is True:
            self.fire(FollowerEvent.LEADER_ENGINE_STOPPED, "the leader's engine stopped")
        if phase is Phase.SERVING and self._leader_seen_draining and \
                self.fire(FollowerEvent.ABORTED):
            with contextlib.suppress(DrainConflict):
                self.host.abort_drain()
        if (_visible(doc), True) != seen:  # the leader's every change is not ours
            self.host.changed()

    # --- step 3: this pod's drain ------------------------------------------------------

    def drain_started(self, drain: DrainRecord) -> None:
        """This pod's drain started (or resumed): join the group's, or go on alone."""
        if self.fire(FollowerEvent.DRAIN_STARTED):
            self._began()
        elif self.state is FollowerState.DRAINING and self._drain_began is None:
            self._began()  # resumed by a restarted coordinator
        if self.state is FollowerState.DRAINING:
            self._schedule_gate(drain)
            if not self._leader_seen_draining:
                self._spawn(self._forward(drain.reason), "group-forward")

    def _began(self) -> None:
        self._drain_began = self.monotonic()

    def _schedule_gate(self, drain: DrainRecord) -> None:
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        delay = max(0.0, self.budget.gate_at(drain.deadlines.started_at) - self.clock())
        self._gate_timer = asyncio.get_running_loop().call_later(
            delay, self.fire, FollowerEvent.GATE_EXPIRED,
            "the leader's engine did not stop within its share of the budget")

    async def _forward(self, reason: str) -> None:
        with contextlib.suppress(GroupError):
            async for attempt in retrying(self.leader_timeout_s,
                                          give_up=lambda: self.state is not
                                          FollowerState.DRAINING):
                with attempt:
                    await self.client.forward_drain(self.membership.index, reason)

    def _drain_locally(self) -> None:
        if self.host.phase is Phase.SERVING:
            self.host.start_drain("group: the leader is unreachable")

    def new_cycle(self) -> None:
        self.fire(FollowerEvent.NEW_CYCLE)
        self._announce_soon()

    # --- step 5: the summary -----------------------------------------------------------

    def drain_finished(self, drain: DrainRecord) -> None:
        if drain.outcome == "aborted":
            return
        report = own_report(self.membership.index, drain.outcome, drain.causes,
                            drain.outcomes.values(), self.mode, self.reason).to_dict()
        self._spawn(self._report(report), "group-report")

    async def _report(self, report: dict[str, Any]) -> None:
        try:
            async for attempt in retrying(max(self.leader_timeout_s, 5.0)):
                with attempt:
                    await self.client.report(self.membership.index, report)
        except GroupError as exc:
            log.warning("group member %d: the summary did not reach the leader: %s",
                        self.membership.index, exc)
            self.last_error = str(exc)
            self.host.changed()
            return
        self.fire(FollowerEvent.REPORTED)

    # --- what /status shows and the state file keeps -------------------------------------

    @property
    def summary(self) -> dict[str, Any] | None:
        return (self.leader or {}).get("summary")

    def settled(self) -> bool:
        """Nothing more to wait for: on its own, or reported and the group's summary
        complete."""
        if self.mode == MODE_LOCAL:
            return True
        summary = self.summary
        return self.state is FollowerState.REPORTED and bool(summary and summary.get("complete"))

    def to_status(self) -> dict[str, Any]:
        leader = self.leader or {}
        return {"state": self.state.value, "mode": self.mode, "reason": self.reason,
                "kill_may_run": self.state in KILL_MAY_RUN,
                "leader": {"reachable": self.reachable, "error": self.last_error,
                           "phase": leader.get("phase"),
                           "engine_stopped": leader.get("engine_stopped")},
                "summary": self.summary}

    def to_record(self) -> dict[str, Any]:
        return {"state": self.state.value, "mode": self.mode, "reason": self.reason,
                "leader_seen_draining": self._leader_seen_draining}

    def restore(self, record: dict[str, Any]) -> None:
        self.state = FollowerState(record["state"])
        self.mode = MODE_LOCAL if record.get("mode") == MODE_LOCAL else MODE_GROUP
        reason = record.get("reason")
        self.reason = str(reason)[:500] if reason is not None else None
        self._leader_seen_draining = bool(record.get("leader_seen_draining"))
        if self.state in KILL_MAY_RUN:
            self.gate.set()


def _visible(doc: dict[str, Any] | None) -> tuple[Any, ...]:
    """What of the leader's document this follower's ``/status`` shows."""
    doc = doc or {}
    summary = doc.get("summary") or {}
    return (doc.get("phase"), doc.get("engine_stopped"), summary.get("complete"),
            summary.get("outcome"), tuple(bool(p.get("reported"))
                                          for p in summary.get("pods") or ()))
