"""The coordinator's live state: phase machine, workers, migrations, processes, drain.

``Coordinator`` is what the HTTP handlers talk to. It implements the drain controller's
``Fleet`` protocol, holds the ``/status`` view (``status_view.StatusView``), persists the
state file on every change, and at start-up resumes a persisted drain, or, when the persisted
drain is done and its processes are gone, starts the next cycle (serving, the drain kept as
``last_drain``). A state file that cannot be restored whole is set aside and the coordinator
starts fresh (``coordinator/drain/state_file.py``).

Cycles: a drain that is done ends its cycle when a new worker registers (``register``) or
when a restarted coordinator finds every process of the drain gone (``start``); the finished
drain's workers are forgotten, its pending handoffs expire, and the doorbell is reset.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from coordinator import startup_check
from coordinator.drain.budget import total_budget
from coordinator.drain.changes import ChangeSignal
from coordinator.drain.controller import DrainController
from coordinator.drain.outcome import NOTHING_TO_DRAIN
from coordinator.drain.phases import Phase, PhaseMachine, Transition
from coordinator.drain.ports import Killer
from coordinator.drain.record import DrainConfig, DrainRecord
from coordinator.engines import PROFILES
from coordinator.errors import DrainConflict, LimitReached
from coordinator.group.membership import membership
from coordinator.kill import adoption, identity
from coordinator.kill.policy import TierSpec
from coordinator.service import drain_log, expiry, posture, reach
from coordinator.service.auth import CHECK_EVERY_S, TokenFile
from coordinator.service.doorbell import Doorbell
from coordinator.service.fleet import WorkerFleet
from coordinator.service.metrics import CoordinatorMetrics
from coordinator.service.migrations import AckResult, MigrationBook
from coordinator.service.models import RegisterRequest, ReportRequest
from coordinator.service.notifier import Notifier
from coordinator.service.persistence import StateKeeper
from coordinator.service.process_scan import ProcessScan, Roots
from coordinator.service.registry import Worker, WorkerRegistry
from coordinator.service.restore import RestoredState
from coordinator.service.status_view import StatusView
from coordinator.service.worker_moves import WorkerMove, WorkerState, after, apply
from coordinator.settings import Settings

if TYPE_CHECKING:
    from coordinator.group.node import ControllerHost, GroupNode
    from coordinator.service.engine_probe import EngineProbe
    from coordinator.service.router_adapters import RouterAdapters
    from coordinator.service.stream_ender import StreamEnderTask

log = logging.getLogger(__name__)



class Coordinator:
    """Everything one coordinator knows; single event loop, no locks."""

    def __init__(self, settings: Settings, kill: Killer,
                 checked: posture.Posture | None = None) -> None:
        self.settings = settings
        # Raises InsecureSettings before anything is built: nothing serves on such settings.
        # ``checked``: what ``serve`` found already (the token file is read once).
        self.posture = checked or posture.check(settings)
        self.token = TokenFile(self.posture.token, settings.token_file)
        """The token in force, reread when ``--token-file`` changes."""
        self._token_watch: asyncio.Task[None] | None = None
        self.instance = uuid.uuid4().hex[:8]
        self.started_at = time.time()
        self.changes = ChangeSignal()
        self.metrics = CoordinatorMetrics()
        self.machine = PhaseMachine(on_change=self._changed)
        self._timeline_seen = len(self.machine.timeline)
        self.registry = WorkerRegistry(on_change=self.bump, on_exit=self.worker_exited)
        self.migrations = MigrationBook(settings.max_handoffs, settings.max_early_acks)
        self.notifier = Notifier(settings.ping_interval_s)
        self.doorbell = Doorbell.from_setting(settings.doorbell)
        self.state = StateKeeper(self, settings.state_file)
        self.writer = self.state.writer
        self.rules = adoption.AdoptionRules(
            pids=tuple(settings.adopt_pids), patterns=tuple(settings.adopt_patterns),
            confine_to=settings.confine_to_pid,
        )
        self.scan = ProcessScan(self.rules, on_change=self.processes_changed)
        self.engine_probe: EngineProbe | None = None
        if settings.engine_metrics_url:
            # Imported here: a pod without --engine-metrics-url never parses Prometheus text.
            from coordinator.service.engine_probe import EngineProbe

            self.engine_probe = EngineProbe(
                settings.engine_metrics_url, tuple(settings.engine_inflight_metrics),
                on_change=self.bump)
        self.ender: StreamEnderTask | None = None
        """``--end-streams``: the drain's ending of the engine's streams for the proxy."""
        profile_ender = PROFILES[settings.engine].ender
        if settings.end_streams and profile_ender is not None and settings.engine_url:
            from coordinator.service.stream_ender import StreamEnderTask

            self.ender = StreamEnderTask(self, profile_ender, settings.engine_url)
        self.routers: RouterAdapters | None = None
        """The routers told of a drain's start and abort through their own API."""
        if settings.routers:
            # Imported here: their retries (tenacity) and HTTP client serve --router alone.
            from coordinator.service.router_adapters import RouterAdapters

            self.routers = RouterAdapters(settings.routers, settings.router_worker_url,
                                          startup_check.read_router_token(settings),
                                          self.metrics, on_change=self.bump)
        self._loop_ready = False
        self._notify_pending = False
        self._sweeper: asyncio.Task[None] | None = None
        self.effective = startup_check.effective(settings)
        """The settings a drain runs with (budget split, adoption), shown in ``/status``."""
        self.view = StatusView(self)
        """``/status`` as documents and as bytes, cached per generation."""
        self.long_polls = 0
        """``GET /status?wait`` callers waiting now (bounded by ``max_long_polls``)."""
        self.fleet = WorkerFleet(self)
        """The workers' side of a drain (the controller's ``Fleet``)."""
        budget_s = total_budget(settings.grace_period_s, settings.safety_margin_s)
        self.group, host = self._group_node(budget_s)
        """This pod's part in a group drain (docs/group.md); None in no group."""
        self.controller = DrainController(
            machine=self.machine,
            changes=self.changes,
            fleet=self.group.fleet(self.fleet) if self.group else self.fleet,
            kill=self.group.killer(kill) if self.group else kill,
            config=DrainConfig(
                budget_s=self.group.drain_budget_s if self.group else budget_s,
                tier_timeout_s=settings.tier_timeout_s,
                confirm_s=settings.confirm_s,
                termination_share=settings.termination_share,
                min_drain_s=settings.min_drain_s,
                prekill_timeout_s=settings.prekill_timeout_s,
                main_exit_s=PROFILES[settings.engine].main_exit_s,
                engine_kills=PROFILES[settings.engine].engine_kills,
            ),
            on_outcome=lambda _outcome: self.processes_changed(),
            on_finished=self._finished,
        )
        if host is not None:
            host.controller = self.controller
        self.token.listeners.append(self._token_changed)

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume a persisted drain, discover adopted trees, start the process scanner."""
        self._loop_ready = True
        if self.doorbell is not None:
            try:
                self.doorbell.open()
            except OSError as exc:
                log.warning("no doorbell (%s): workers learn of a drain from their streams",
                            exc)
                self.doorbell = None
        if self.group is not None:
            self.group.start()
        if self.settings.state_file is not None:
            await self.state.load(self.settings.state_file)
        await self.rescan()
        if (self.routers is not None and self.settings.router_join
                and self.machine.phase is Phase.SERVING):
            self.routers.join()
        self.scan.start(self.settings.process_scan_interval_s, self._roots,
                        paused=lambda: self.machine.phase.killing_or_done)
        await self.writer.flush()  # a path that cannot be written shows in /status at once
        self._sweeper = asyncio.get_running_loop().create_task(expiry.sweep_forever(self))
        if self.token.path is not None:
            self._token_watch = asyncio.get_running_loop().create_task(self._watch_token())

    async def stop(self) -> None:
        """Close streams, stop the scanner, the sweeper and the drain task, write the state a
        last time."""
        self.notifier.close_all()
        if self.engine_probe is not None:
            self.engine_probe.stop()
        if self.ender is not None:
            self.ender.stop()
        for task in (self._sweeper, self._token_watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.scan.stop()
        await self.controller.close()
        if self.group is not None:
            await self.group.stop()
        if self.routers is not None:
            await self.routers.close()
        self.registry.close()
        await self.writer.close()
        if self.doorbell is not None:
            self.doorbell.close()

    async def _watch_token(self) -> None:
        """Look at the token file every second (``coordinator.service.auth``)."""
        error = self.token.error
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            self.token.check()
            if self.token.error != error:  # a reload bumps through its listener
                error = self.token.error
                self.bump()

    def _group_node(self, budget_s: float) -> tuple[GroupNode | None, ControllerHost | None]:
        """This pod's group node and the host its controller is attached to once built;
        (None, None) in no group. The group's code (the follower's link to its leader, the
        leader's book) is imported only by a pod in a group; ``membership`` raises
        ``GroupSettingError`` for group settings that contradict each other either way."""
        if membership(self.settings, os.environ) is None:
            return None, None
        from coordinator.group.node import ControllerHost, GroupNode

        host = ControllerHost(self.machine, self.bump)
        return (GroupNode.build(self.settings, os.environ, budget_s, host, self.posture.token),
                host)

    def _token_changed(self, token: str) -> None:
        if self.group is not None:
            self.group.token_changed(token)
        self.bump()

    # --- generation, cache, persistence ----------------------------------------------------

    def bump(self) -> None:
        """Something in ``/status`` changed."""
        self.machine.bump()

    def processes_changed(self) -> None:
        """The process list changed (a scan, a kill outcome)."""
        self.view.processes_changed()
        self.machine.bump()

    def _changed(self, _generation: int) -> None:
        timeline = self.machine.timeline
        if len(timeline) != self._timeline_seen:
            if self.machine.phase.killing_or_done:
                self.view.processes_changed()  # the list switches to the kill's outcomes
            self._on_transition(timeline[max(0, self._timeline_seen - 1):])
            self._timeline_seen = len(timeline)
        if self._loop_ready:
            # Long-pollers wake after the current step is over, so the drain's push to the
            # workers' streams (queued in the same step) goes out first.
            if not self._notify_pending:
                self._notify_pending = True
                asyncio.get_running_loop().call_soon(self._notify_waiters)
            self.writer.mark_dirty()
        else:
            self.changes.notify()

    def _notify_waiters(self) -> None:
        self._notify_pending = False
        self.changes.notify()

    def _on_transition(self, entries: list[Transition]) -> None:
        for previous, current in itertools.pairwise(entries):
            # Serving is no drain phase; done lasts until the next cycle, not the drain.
            if not previous.phase.idle:
                self.metrics.phase_seconds.labels(previous.phase.value).observe(
                    max(0.0, current.at - previous.at))
        self.metrics.set_phase(self.machine.phase)

    def persist(self, now: bool = False) -> Awaitable[None] | None:
        """Save the state; never raises for the disk (a failed write is counted, shown in
        ``/status`` ``state_file`` and retried, and the drain goes on)."""
        if now:
            return self.writer.flush()
        self.writer.mark_dirty()
        return None

    def apply_restored(self, state: RestoredState) -> None:
        """Take over a state file's objects (``StateKeeper.load`` built them all first)."""
        for worker in state.workers:
            self.registry.restore(worker)
            if worker.reach_uid is not None:
                self.scan.reach[worker.pid] = worker.reach_uid
        self.migrations = state.migrations
        self.migrations.max_pending = self.settings.max_handoffs
        self.migrations.max_early = self.settings.max_early_acks
        self.controller.last = state.last
        # The restored history was measured by the coordinator that lived it: phase
        # durations are observed from here on.
        self._timeline_seen = len(state.timeline) + 1
        self.machine.restore(state.phase, state.generation, state.timeline)
        self.view.processes_changed()
        self.metrics.set_phase(state.phase)
        if self.group is not None:
            self.group.restore(state.group)
        if state.drain is not None and state.phase is not Phase.SERVING:
            log.info("state file: resuming a drain in phase %s", state.phase)
            self.controller.resume(state.drain, state.phase)

    def abort_drain(self) -> bool:
        """``DELETE /drain``: abort the running drain (True); or, once a drain that found
        nothing to drain is done, end its cycle (False): it terminated nothing, so nothing
        but the mistaken call keeps the pod out of rotation, and an engine that is adopted,
        not registered, would never start the next cycle itself. ``DrainConflict`` in any
        other case (no drain; a drain that terminates or terminated processes)."""
        drain = self.controller.drain
        if (self.machine.phase is Phase.DONE and drain is not None
                and drain.outcome == NOTHING_TO_DRAIN):
            self.new_cycle("dismissed", "a drain that found nothing to drain was dismissed "
                           "(DELETE /drain)")
            return False
        self.controller.abort()
        return True

    def new_cycle(self, trigger: str, note: str) -> None:
        """End the done drain's cycle: serving again, the drain kept as ``last_drain``."""
        self.controller.new_cycle(note)
        for worker_id in list(self.registry.workers):  # the finished cycle's engine
            self.deregister(worker_id)
        expired = self.migrations.expire_all()
        if expired:
            self.metrics.migrations.labels("expired").inc(expired)
        if self.doorbell is not None:
            self.doorbell.reset()  # new workers must not find the finished drain's ring
        self.metrics.new_cycles.labels(trigger).inc()
        if self.group is not None:
            self.group.new_cycle()
        self.processes_changed()
        log.info("new cycle (%s): serving again", note)

    # --- process scan (for /status while no kill runs) ---------------------------------------

    async def rescan(self) -> None:
        """Re-discover adopted roots and re-list every registered and adopted tree."""
        await self.scan.rescan(self._roots())

    def _roots(self) -> Roots:
        return [(w.pid, w.role) for w in self.registry.alive()]

    # --- workers -----------------------------------------------------------------------------

    def register(self, body: RegisterRequest, *, uids: tuple[int, int] | None = None,
                 reach_uid: int | None = None) -> tuple[Worker, bool]:
        """Vet and register a worker (``RefusedTarget``/``TargetNotFound`` on refusal):
        ``uids`` its process's real and saved UIDs, ``reach_uid`` the non-root UID that
        registered it without the token (its tree is bounded by what that UID could signal).

        While ``done``, a new worker starts the next cycle (``StateKeeper.admit``)."""
        phase = self.machine.phase
        if phase is Phase.TERMINATING:
            raise DrainConflict(f"cannot register a worker while {phase}")
        found = identity.vet(body.pid, body.start_time, self.settings.confine_to_pid)
        if phase is Phase.DONE:
            self.state.admit(found)  # the finished cycle's workers are forgotten first
            phase = self.machine.phase
        if (self.registry.find(found.pid, found.start_time) is None
                and len(self.registry.workers) >= self.settings.max_workers):
            raise LimitReached(
                "max_workers", f"{len(self.registry.workers)} workers are registered, the "
                f"limit (--max-workers); exited ones are forgotten "
                f"{self.settings.expire_after_s:g} s after they exit")
        tiers = tuple(
            TierSpec(
                name=t.name, pattern=t.pattern, roles=tuple(t.roles),
                signal=int(signal.Signals[t.signal]), include_root=t.include_root,
                **({"timeout_s": t.timeout_s} if t.timeout_s is not None else {}),
            )
            for t in body.tiers
        )
        state = after(WorkerState.SERVING,
                      WorkerMove.DRAIN) if phase.draining else WorkerState.SERVING
        worker, created = self.registry.register(
            found, role=body.role, name=body.name, url=body.url, tiers=tiers,
            include_tree=body.include_tree, state=state, uids=uids, reach_uid=reach_uid)
        if created:
            if reach_uid is not None:
                self.scan.reach[worker.pid] = reach_uid
            self.metrics.workers.set(len(self.registry.workers))
            asyncio.get_running_loop().create_task(self.rescan())
        return worker, created

    def deregister(self, worker_id: str) -> Worker | None:
        worker = self.registry.deregister(worker_id)
        if worker is not None:
            self.notifier.close_worker(worker_id)
            self.metrics.workers.set(len(self.registry.workers))
            self.scan.forget_root(worker.pid)
            self.processes_changed()
        return worker

    def report(self, worker: Worker, body: ReportRequest) -> None:
        """A worker's in-flight count, handoffs and pre-kill confirmation; ``LimitReached``
        (nothing applied) when its handoffs would pass ``max_handoffs``."""
        self.migrations.check_room([(h.request_id, h.ack == "engine") for h in body.handoffs])
        uids = reach.worker_uids(worker) if self.migrations.early_owners else None

        def may_settle(uid: int) -> bool:
            return uids is not None and uid in uids

        for handoff in body.handoffs:
            added = self.migrations.add(worker.id, worker.url, handoff.request_id,
                                        handoff.tokens, handoff.detail,
                                        engine_migrated=handoff.ack == "engine",
                                        may_settle=may_settle)
            if added is not None:
                worker.handed_back += 1
                self.metrics.migrations.labels("handed_back").inc()
            if added in ("acked", "engine"):
                self.metrics.migrations.labels(added).inc()
        if body.inflight is not None:
            worker.inflight = body.inflight
            worker.awaiting_report = False
            if body.inflight == 0:
                apply(worker, WorkerMove.IDLE)
        if body.prekill_done:
            worker.prekill_done = True
        if body.notified_at is not None:
            worker.notified_at = body.notified_at
        self.bump()

    def acked_workers(self, request_ids: list[str]) -> list[Worker]:
        """The workers whose pending handoffs ``request_ids`` would settle (one that left
        the registry stands as an unknown owner: only a trusted caller reaches it)."""
        pending = self.migrations.pending
        ids = {pending[r].worker for r in request_ids if r in pending}
        return [self.registry.workers.get(i)
                or Worker(i, 0, 0.0, "", "", None, state=WorkerState.EXITED)
                for i in sorted(ids)]

    def continued(self, request_ids: list[str]) -> tuple[list[str], list[str]]:
        """The proxy took these ended streams over (``--end-streams``): (taken, refused)."""
        if self.ender is None:
            return [], list(dict.fromkeys(request_ids))
        return self.ender.acknowledge(request_ids)

    def ack(self, request_ids: list[str], owner: int | None = None) -> AckResult:
        """Settle handoffs; ``owner``: the non-root UID acknowledging without the token (an
        early acknowledgement of its settles only a handoff of a worker it reaches)."""
        result = self.migrations.ack(request_ids, owner)
        if result.acked:
            self.metrics.migrations.labels("acked").inc(len(result.acked))
        if result.acked or result.early:
            self.bump()
        return result

    def stream_opened(self, worker: Worker) -> None:
        worker.connected += 1
        worker.reconnect_awaited = False
        self.bump()

    def stream_closed(self, worker: Worker) -> None:
        worker.connected = max(0, worker.connected - 1)
        if not worker.connected:
            worker.awaiting_report = False  # it cannot have heard of the drain, or is gone
        self.bump()

    def worker_exited(self, worker: Worker) -> None:
        """A registered worker's process ended: list what it left behind (children it
        started since the last scan, reparented away) at once, while no kill runs."""
        self.scan.root_exited(worker.pid, worker.start_time)
        if self.machine.phase.killing_or_done:
            return  # the kill's own discovery is at work
        try:
            self.scan.rescan_soon(self._roots())
        except RuntimeError:
            log.warning("worker %s exited with no event loop to scan from", worker.id)

    def _finished(self, drain: DrainRecord) -> None:
        self.migrations.forget_early()
        drain_log.drain_ended(drain, self.migrations.counts())
        self.metrics.drains.labels(drain.outcome or "unknown").inc()
        self.metrics.drain_seconds.observe(
            max(0.0, (drain.ended_at or time.time()) - drain.deadlines.started_at))
        if drain.outcome != "aborted":
            for outcome in drain.outcomes.values():
                self.metrics.fates.labels(outcome.fate.value).inc()
        if self.group is not None:
            self.group.drain_finished(drain)
        self.bump()

