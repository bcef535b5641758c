"""The workers' side of a drain: what the drain controller asks of the service (its ``Fleet``
port), and the events the workers are sent.

    drain_started   the doorbell rung, ``drain`` pushed, the routers told (not awaited),
                    every live worker moved to draining
    migration_settled   no handoff pending, no worker with requests in flight or a report owed
    terminating     ``terminate`` pushed (pre-kill hooks), workers moved; whom to wait for
    kill_targets    registered roots, adopted roots, and what exited workers left behind
    cut_requests    after the kill: what an adopted engine still had in flight (its gauges),
                    and the streams ``--end-streams`` ended that the proxy did not take over
    lost_requests   at the end: what no router acknowledged
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import shutdown_wire as wire
from coordinator.drain.phases import Phase
from coordinator.drain.record import DrainRecord
from coordinator.kill import adoption
from coordinator.kill.policy import Target
from coordinator.kill.report import ProcessOutcome
from coordinator.service.worker_moves import WorkerMove, apply

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from coordinator.service.runtime import Coordinator

log = logging.getLogger(__name__)


class WorkerFleet:
    """Implements ``coordinator.drain.ports.Fleet`` over one coordinator's state."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def persist(self, now: bool = False) -> Awaitable[None] | None:
        return self.coordinator.persist(now)

    def catch_up_events(self) -> list[dict[str, Any]]:
        """Events a stream opened mid-drain must see right after its ``hello``."""
        c = self.coordinator
        drain = c.controller.drain
        phase = c.machine.phase
        if drain is None or phase.idle:
            return []
        events = [self._drain_event(drain)]
        if phase is Phase.TERMINATING:
            events.append(self._terminate_event(drain))
        return events

    def _drain_event(self, drain: DrainRecord) -> dict[str, Any]:
        c = self.coordinator
        d = drain.deadlines
        # "type" first: the stream recognises a drain line by its first bytes (DRAIN_LINE)
        return {"type": wire.EVENT_DRAIN, "generation": c.machine.generation,
                "reason": drain.reason, "started_at": d.started_at, "deadline_at": d.deadline_at,
                "migration_deadline_at": d.migration_deadline_at}

    def _terminate_event(self, drain: DrainRecord) -> dict[str, Any]:
        c = self.coordinator
        return {"type": wire.EVENT_TERMINATE, "generation": c.machine.generation,
                "deadline_at": drain.deadlines.deadline_at}

    def drain_started(self, drain: DrainRecord) -> None:
        c = self.coordinator
        if drain.expired_before is None:  # a resumed drain keeps its own
            drain.expired_before = c.migrations.expired
        if c.doorbell is not None:
            c.doorbell.ring()
        c.notifier.publish(self._drain_event(drain))
        if c.routers is not None:
            c.routers.drain_started(drain.deadlines.migration_deadline_at)
        if c.engine_probe is not None:
            c.engine_probe.start()
        if c.ender is not None:
            c.ender.drain_started()
        for worker in c.registry.alive():
            apply(worker, WorkerMove.DRAIN)
            # A worker that hears of the drain now holds the migrating phase until it has
            # reported; one that never connected cannot report and counts as drained.
            worker.awaiting_report = c.notifier.connected(worker.id) > 0
            worker.notified_at = None
        c.metrics.drains_started.inc()
        c.bump()

    def drain_aborted(self) -> None:
        c = self.coordinator
        if c.doorbell is not None:
            c.doorbell.reset()  # before the abort line: a worker re-arms when it reads it
        c.notifier.publish({"type": wire.EVENT_ABORT, "generation": c.machine.generation})
        if c.routers is not None:
            c.routers.drain_aborted()
        if c.engine_probe is not None:
            c.engine_probe.stop()
        if c.ender is not None:
            c.ender.stop()
        for worker in c.registry.alive():
            apply(worker, WorkerMove.ABORT)
            worker.prekill_done = False
            worker.awaiting_report = False

    def terminating(self, drain: DrainRecord) -> list[str]:
        c = self.coordinator
        # The engine probe reads on while the kill runs: what the engine still counts at its
        # last answer is what the kill cut (``cut_requests``).
        if c.engine_probe is not None:
            c.engine_probe.ending = True
        c.notifier.publish(self._terminate_event(drain))
        waiting: list[str] = []
        for worker in c.registry.alive():
            apply(worker, WorkerMove.TERMINATE)
            if not worker.prekill_done and (c.notifier.connected(worker.id)
                                            or worker.reconnect_awaited):
                waiting.append(worker.id)
        c.bump()
        return waiting

    def migration_settled(self) -> bool:
        c = self.coordinator
        if c.migrations.pending:
            return False
        if c.engine_probe is not None and not c.engine_probe.settled:
            return False
        if c.ender is not None and not c.ender.settled:
            return False
        return all(not w.inflight and not w.awaiting_report and not w.reconnect_awaited
                   for w in c.registry.alive())

    def prekill_settled(self, worker_ids: list[str]) -> bool:
        c = self.coordinator
        for worker_id in worker_ids:
            worker = c.registry.workers.get(worker_id)
            if (worker is not None and worker.alive and not worker.prekill_done
                    and (c.notifier.connected(worker_id) or worker.reconnect_awaited)):
                return False
        return True

    def kill_targets(self) -> list[Target]:
        c = self.coordinator
        c.registry.settle()  # a root that died a moment ago is an exited worker, not a target
        targets = [w.target() for w in c.registry.alive()]
        registered = {t.pid for t in targets}
        c.scan.adopted = adoption.discover(c.rules, exclude=registered)
        adopted_tiers = tuple(c.settings.adopt_tiers)
        targets.extend(Target(pid=f.pid, start_time=f.start_time, role="adopted",
                              tiers=adopted_tiers)
                       for f in c.scan.adopted)
        # What exited workers left behind (reparented away from their tree: found by their
        # session, group or unit, or last listed under them) and what left a live tree, by
        # identity (gone ones are reported gone). The preStop hook waiting on us is not.
        drain = c.controller.drain
        for worker in c.registry.workers.values():
            if not worker.alive:
                c.scan.root_exited(worker.pid, worker.start_time)
                # Its own end goes into the drain's outcomes, which the kill receives as
                # ``prior`` and reports as found: a crashed main process is part of the truth.
                if drain is not None:
                    ended = worker.ended_before_the_kill()
                    drain.outcomes.setdefault((ended.pid, ended.start_time), ended)
        # Each live root with what the scan last listed under it: a root that dies before
        # the kill looks takes those with it, and the kill still reports each one.
        under: dict[int, list[ProcessOutcome]] = {}
        for o in c.scan.scanned.values():
            if o.depth > 0 and o.root_pid is not None:
                under.setdefault(o.root_pid, []).append(o)
        targets = [dataclasses.replace(t, listed=tuple(under.get(t.pid, ()))) for t in targets]
        live = [(t.pid, t.role) for t in targets]
        try:
            remnants = c.scan.kill_remnants(live)
        except Exception:
            log.exception("looking for what exited workers left behind failed")
            remnants = [o for o in c.scan.scanned.values()
                        if o.root_pid in c.scan.exited and o.depth > 0]
        targets.extend(Target(pid=o.pid, start_time=o.start_time, role=o.role or "orphan",
                              include_tree=True) for o in remnants)
        return targets

    def budget_ended(self) -> None:
        c = self.coordinator
        expired = c.migrations.expire_all()
        if expired:
            c.metrics.migrations.labels("expired").inc(expired)
            c.bump()

    def cut_requests(self, drain: DrainRecord) -> int:
        c = self.coordinator
        ended_cut = 0
        if c.ender is not None and c.ender.ending is not None:
            c.ender.stop()
            ending = c.ender.ending
            drain.ended_requests = ending.ended
            drain.continued_requests = len(ending.continued)
            ended_cut = ending.cut
            if ended_cut:
                log.warning("%d of the %d stream(s) ended for the proxy were not taken over: "
                            "cut", ended_cut, ending.ended)
        probe = c.engine_probe
        if probe is None:
            return ended_cut
        probe.stop()
        cut = probe.cut
        if cut:
            log.warning("the engine counted %d request(s) in flight at its last answer (%s): "
                        "the kill cut them", cut, probe.url)
        return cut + ended_cut

    def lost_requests(self, drain: DrainRecord) -> int:
        c = self.coordinator
        self.budget_ended()  # what no router acknowledged by now, none will
        return max(0, c.migrations.expired - (drain.expired_before or 0))
