"""Registered workers: identity, state, in-flight count, and a watch on each one's process.

A worker's process is watched through a pidfd registered with the event loop (readable the
moment the process exits), so a worker that dies is marked ``exited`` on its own, without
polling. Where pidfds are unavailable a slow poll stands in. Both are the kill engine's
``ExitEvents`` (``coordinator.kill.watch``): the registry opens each pidfd, checks after
opening it that the PID is still the registered process, reads through it how the process
exited, and closes it. ``on_exit`` hears of each exit at once (the coordinator scans for what
the worker left behind before anything else).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.kill import pidfd, procfs
from coordinator.kill.identity import ProcessFacts, same_start
from coordinator.kill.policy import Target, TierSpec
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.kill.watch import ExitEvents
from coordinator.service.worker_moves import WorkerMove, WorkerState, after

log = logging.getLogger(__name__)

POLL_FALLBACK_S = 1.0
"""Polling period where pidfds are unavailable (s): a worker's exit is seen within a second,
at one ``/proc`` read per worker per period."""


@dataclass
class Worker:
    """One registered engine process (the root of a process tree)."""

    id: str
    pid: int
    start_time: float
    role: str
    name: str
    url: str | None
    tiers: tuple[TierSpec, ...] = ()
    include_tree: bool = True
    registered_at: float = field(default_factory=time.time)
    state: WorkerState = WorkerState.SERVING
    inflight: int | None = None
    """Last reported in-flight count; None while the worker has never reported."""
    prekill_done: bool = False
    connected: int = 0
    """Open event streams."""
    notified_at: float | None = None
    """When the worker says its ``shutdown_event`` was set for the current drain."""
    pushed_at: float | None = None
    """When the last ``drain`` line was handed to its stream's transport (epoch s; with
    ``notified_at`` it splits the push into the coordinator's part and the worker's)."""
    awaiting_report: bool = False
    """Its stream was open when the drain started and it has not reported its in-flight
    count since: until it does (or disconnects, or exits) the migrating phase holds."""
    handed_back: int = 0
    reconnect_awaited: bool = False
    """Restored from the state file of a coordinator that went away while the worker's
    stream was open: until the worker connects again (or exits), the drain waits for it, so
    it still hears of the drain and of the kill (its pre-kill hook, e.g. a watchdog standing
    down) before its processes are signalled."""
    exited_at: float | None = None
    exit_code: int | None = None
    """How its process ended, read from its pidfd the moment it exited (subprocess
    convention; None when unknown): the kill finds nothing left of it to ask."""
    uids: tuple[int, int] | None = None
    """Its process's real and saved UIDs at registration (who may act on it without the
    token once it has exited, ``coordinator.service.reach``); None when unknown."""
    reach_uid: int | None = None
    """Registered without the token by this non-root UID: its tree holds only processes
    that UID could signal (``Target.reach_uid``). None: registered by root or with the
    token."""

    @property
    def alive(self) -> bool:
        return self.state is not WorkerState.EXITED

    def target(self) -> Target:
        """What the kill engine gets for this worker."""
        return Target(pid=self.pid, start_time=self.start_time, role=self.role,
                      tiers=self.tiers, include_tree=self.include_tree,
                      reach_uid=self.reach_uid)

    def to_status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "role": self.role,
            "name": self.name,
            "url": self.url,
            "state": self.state.value,
            "inflight": self.inflight,
            "handed_back": self.handed_back,
            "connected": self.connected > 0,
            "awaiting_report": self.awaiting_report,
            "notified_at": self.notified_at,
            "pushed_at": self.pushed_at,
            "prekill_done": self.prekill_done,
            "registered_at": self.registered_at,
            "exited_at": self.exited_at,
            "exit_code": self.exit_code,
        }

    def to_record(self) -> dict[str, Any]:
        data = self.to_status()
        data.update(
            # A worker still awaited after one restart is awaited after the next one too.
            connected=self.connected > 0 or self.reconnect_awaited,
            start_time=self.start_time,
            include_tree=self.include_tree,
            uids=list(self.uids) if self.uids is not None else None,
            reach_uid=self.reach_uid,
            tiers=[
                {"name": t.name, "pattern": t.pattern, "roles": list(t.roles),
                 "signal": int(t.signal), "timeout_s": t.timeout_s,
                 "include_root": t.include_root}
                for t in self.tiers
            ],
        )
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Worker:
        tiers = tuple(
            TierSpec(name=t["name"], pattern=t.get("pattern"), roles=tuple(t.get("roles", ())),
                     signal=int(t["signal"]), timeout_s=float(t["timeout_s"]),
                     include_root=bool(t.get("include_root", False)))
            for t in data.get("tiers", ())
        )
        return cls(
            id=data["id"], pid=int(data["pid"]), start_time=float(data["start_time"]),
            role=data["role"], name=data.get("name", ""), url=data.get("url"), tiers=tiers,
            include_tree=bool(data.get("include_tree", True)),
            registered_at=float(data.get("registered_at", time.time())),
            state=WorkerState(data.get("state", WorkerState.SERVING.value)),
            inflight=data.get("inflight"), prekill_done=bool(data.get("prekill_done", False)),
            handed_back=int(data.get("handed_back", 0)), exited_at=data.get("exited_at"),
            exit_code=data.get("exit_code"),
            uids=(int(data["uids"][0]), int(data["uids"][1])) if data.get("uids") else None,
            reach_uid=data.get("reach_uid"),
            reconnect_awaited=bool(data.get("connected"))
            and data.get("state", WorkerState.SERVING.value) != WorkerState.EXITED.value,
        )

    def ended_before_the_kill(self) -> ProcessOutcome:
        """The record of a worker whose process exited before the kill could reach it."""
        return ProcessOutcome(
            pid=self.pid, name=self.name or self.role, start_time=self.start_time,
            root_pid=self.pid, depth=0, role=self.role, fate=Fate.GONE,
            ended_at=self.exited_at, exit_code=self.exit_code,
            detail="exited before the kill" + (
                "" if self.exit_code is not None else " (exit code unknown)"))


class WorkerRegistry:
    """The registered workers, keyed by id; ``on_change`` is called after every change."""

    def __init__(self, on_change: Callable[[], None],
                 on_exit: Callable[[Worker], None] | None = None) -> None:
        self._on_change = on_change
        self._on_exit_hook = on_exit
        self.workers: dict[str, Worker] = {}
        self._exits: ExitEvents[str] = ExitEvents(self._on_exit,
                                                  poll_interval_s=POLL_FALLBACK_S)
        self._fds: dict[str, int] = {}
        """The pidfd of each worker watched through one (opened and closed here)."""
        self._ticks: dict[str, int] = {}
        """Start ticks of each watched worker (its exit status in /proc is trusted by them)."""

    def find(self, pid: int, start_time: float) -> Worker | None:
        """The worker registered for this process, if any."""
        for worker in self.workers.values():
            if worker.pid == pid and same_start(worker.start_time, start_time):
                return worker
        return None

    def register(
        self,
        found: ProcessFacts,
        *,
        role: str,
        name: str | None,
        url: str | None,
        tiers: tuple[TierSpec, ...],
        include_tree: bool,
        state: WorkerState = WorkerState.SERVING,
        uids: tuple[int, int] | None = None,
        reach_uid: int | None = None,
    ) -> tuple[Worker, bool]:
        """Add a worker (or return the existing one for the same process); True if new."""
        existing = self.find(found.pid, found.start_time)
        if existing is not None:
            return existing, False
        worker = Worker(
            id=f"w-{uuid.uuid4().hex[:12]}", pid=found.pid, start_time=found.start_time,
            role=role, name=name or found.name, url=url, tiers=tiers,
            include_tree=include_tree, state=state, uids=uids, reach_uid=reach_uid,
        )
        self.workers[worker.id] = worker
        self._watch(worker)
        self._on_change()
        return worker, True

    def restore(self, worker: Worker) -> None:
        """Take a worker back from the state file, checking its process is still the same."""
        self.workers[worker.id] = worker
        if worker.alive:
            self._watch(worker)  # checks the identity too, after opening the pidfd

    def deregister(self, worker_id: str) -> Worker | None:
        """Remove a worker; None when unknown."""
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            return None
        self._unwatch(worker_id)
        self._on_change()
        return worker

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive]

    def settle(self) -> None:
        """Mark exited, now, every worker whose process has exited but whose exit the loop
        has not delivered yet (its pidfd is readable, the callback still queued): a kill
        planned in between would take a dead root for a live one, and miss what was listed
        under it. Without pidfds, the poll not yet due is done now."""
        self._exits.settle()

    def close(self) -> None:
        for worker_id in list(self._ticks):
            self._unwatch(worker_id)
        self._exits.close()

    # --- process watch -------------------------------------------------------------------

    def _watch(self, worker: Worker) -> None:
        fd: int | None
        try:
            fd = os.pidfd_open(worker.pid)
        except ProcessLookupError:
            self._mark_exited(worker)
            return
        except (OSError, AttributeError):
            fd = None  # no pidfds here: the slow poll stands in
        try:
            # The PID may have been reused between the identity check and pidfd_open.
            stat = procfs.read_stat(worker.pid)
        except OSError:
            if fd is not None:
                os.close(fd)
            raise
        if stat is None or stat.zombie or not same_start(
                stat.start_time(procfs.boot_time()), worker.start_time):
            if fd is not None:
                os.close(fd)
            self._mark_exited(worker)
            return
        if fd is not None:
            self._fds[worker.id] = fd
        self._ticks[worker.id] = stat.start_ticks
        self._exits.watch(worker.id, worker.pid, fd, stat.start_ticks)

    def _unwatch(self, worker_id: str) -> None:
        self._exits.unwatch(worker_id)
        self._ticks.pop(worker_id, None)
        fd = self._fds.pop(worker_id, None)
        if fd is not None:
            os.close(fd)

    def _on_exit(self, worker_id: str) -> None:
        worker = self.workers.get(worker_id)
        fd = self._fds.get(worker_id)
        if worker is not None and fd is not None:
            try:
                worker.exit_code = pidfd.exit_code(fd, worker.pid,
                                                   self._ticks.get(worker_id, -1))
            except OSError:
                log.exception("could not read how worker %s exited", worker_id)
        self._unwatch(worker_id)
        if worker is not None and worker.alive:
            self._mark_exited(worker)

    def _mark_exited(self, worker: Worker) -> None:
        log.info("worker %s (pid %d) exited", worker.id, worker.pid)
        worker.state = after(worker.state, WorkerMove.EXIT)
        worker.exited_at = time.time()
        worker.inflight = 0 if worker.inflight else worker.inflight
        if self._on_exit_hook is not None:
            try:
                self._on_exit_hook(worker)
            except Exception:
                log.exception("worker exit hook failed for %s", worker.id)
        self._on_change()

