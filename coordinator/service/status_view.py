"""``/status`` as documents and as bytes: the full view and the router's, cached per generation.

Every change to what ``/status`` shows bumps the phase machine's generation; a view is
serialized at most once per generation. The process list (hundreds of entries) is serialized
apart, and only when it may have changed (``processes_changed``), so a change elsewhere (a
phase, a worker's report) re-serializes a few hundred bytes, not the whole document.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from coordinator import __version__
from coordinator.drain.phases import Phase
from coordinator.kill.membership import escapes
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.service import listener
from coordinator.service.persistence import TIMELINE_KEPT
from coordinator.service.process_scan import process_entry

if TYPE_CHECKING:
    from coordinator.service.runtime import Coordinator

FULL_VIEW = "full"
ROUTER_VIEW = "router"
"""``GET /status?view=router``: the document without ``processes`` and the history."""
VIEWS = (FULL_VIEW, ROUTER_VIEW)


class StatusView:
    """The documents of one coordinator, and their bytes cached per generation."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._bytes: dict[str, tuple[int, str, bytes]] = {}
        """Per view: (generation, ETag, body); an entry of an older generation is stale."""
        self._processes_epoch = 0
        """Bumped whenever the process list may have changed (its JSON is cached apart)."""
        self._processes: tuple[int, bytes, bytes] | None = None
        self._metrics_owner: tuple[int, int] | None = None
        """(pid, adopted root) of the process serving the engine's metrics, once found."""

    def processes_changed(self) -> None:
        """The process list may have changed (a scan, a kill outcome, a phase change)."""
        self._processes_epoch += 1

    def etag(self, view: str = FULL_VIEW) -> str:
        c = self.coordinator
        suffix = "" if view == FULL_VIEW else f"-{view}"
        return f'"{c.instance}-{c.machine.generation}{suffix}"'

    def status_bytes(self, view: str = FULL_VIEW) -> tuple[int, str, bytes]:
        """(generation, ETag, body) of ``/status`` (or its ``router`` view)."""
        generation = self.coordinator.machine.generation
        cached = self._bytes.get(view)
        if cached is not None and cached[0] == generation and \
                self.coordinator.settings.status_cache:
            return cached
        if view == ROUTER_VIEW:
            body = json.dumps(self.router_document(), separators=(",", ":")).encode()
        else:
            counts, processes = self._processes_json()
            head = json.dumps(self.status_document(processes=False),
                              separators=(",", ":")).encode()
            body = b"".join((head[:-1], b',"counts":', counts, b',"processes":', processes,
                             b"}"))
        cached = (generation, self.etag(view), body)
        self._bytes[view] = cached
        return cached

    def router_document(self) -> dict[str, Any]:
        """What a router needs from ``/status``: no process list, timeline or history, so
        a long-poll answer to many routers stays a few KB whatever the pod's size."""
        c = self.coordinator
        phase = c.machine.phase
        current = c.controller.drain if phase is not Phase.SERVING else None
        return {
            "phase": phase.value,
            "generation": c.machine.generation,
            "ready": phase is Phase.SERVING,
            "drain": current.to_status() if current else None,
            "workers": [w.to_status() for w in c.registry.workers.values()],
            "migrations": [m.to_dict() for m in c.migrations.pending.values()],
            "migration_counts": c.migrations.counts(),
            "stream_ending": c.ender.to_status() if c.ender is not None else None,
        }

    def status_document(self, *, processes: bool = True) -> dict[str, Any]:
        """The ``/status`` document (the drain summary is the same document at ``done``)."""
        c = self.coordinator
        controller = c.controller
        phase = c.machine.phase
        current = controller.drain if phase is not Phase.SERVING else None
        last = controller.last
        document: dict[str, Any] = {
            "phase": phase.value,
            "generation": c.machine.generation,
            "ready": phase is Phase.SERVING,
            "drain": current.to_status() if current else None,
            "outcome": (current.outcome if current else (last.outcome if last else None)),
            "last_drain": last.to_status() if last else None,
            "workers": [w.to_status() for w in c.registry.workers.values()],
            "migrations": [m.to_dict() for m in c.migrations.pending.values()],
            "migration_counts": c.migrations.counts(),
            "stream_ending": c.ender.to_status() if c.ender is not None else None,
            "adopted": self.adopted(),
            "timeline": [t.to_dict() for t in c.machine.timeline[-TIMELINE_KEPT:]],
            "coordinator": {"pid": os.getpid(), "version": __version__,
                            "started_at": c.started_at},
            "state_file": c.state.status(),
            "security": {**c.posture.to_status(), "token_file": c.token.status()},
            "settings": c.effective,
            "engine_inflight": ({**c.engine_probe.reading.to_status(),
                                 "root": self.metrics_root()}
                                if c.engine_probe is not None else None),
            "main_handover": {"waiting": controller.handover.waiting,
                              "handed": controller.handover.handed},
            "routers": c.routers.to_status() if c.routers is not None else [],
            "escapes": escapes(c.scan.unwatched),
        }
        if c.group is not None:
            document["group"] = c.group.to_status()
        if processes:
            entries = self.process_list()
            document.update(counts=_counts(entries), processes=entries)
        return document

    def adopted(self) -> list[dict[str, Any]]:
        """The adopted roots, each with the engine's in-flight count when its tree serves the
        metrics URL (None on the others, and while no count has been read)."""
        c = self.coordinator
        reading = c.engine_probe.reading if c.engine_probe is not None else None
        counted = self.metrics_root() if reading is not None and reading.count is not None \
            else None
        return [{"pid": f.pid, "name": f.name,
                 "inflight": reading.count if reading is not None and f.pid == counted
                 else None} for f in c.scan.adopted]

    def metrics_root(self) -> int | None:
        """The adopted root whose tree has the process listening on the metrics URL's port.

        Found once and kept while that process is still listed under that root, so a
        ``/status`` render reads no ``/proc`` fds in the usual case.
        """
        c = self.coordinator
        if c.engine_probe is None:
            return None
        scanned = c.scan.scanned
        if self._metrics_owner is not None:
            pid, root = self._metrics_owner
            listed = scanned.get(pid)
            if listed is not None and (listed.root_pid or pid) == root:
                return root
            self._metrics_owner = None
        roots = {f.pid for f in c.scan.adopted}
        if not roots:
            return None
        url = urlsplit(c.engine_probe.reading.url)
        try:
            port = url.port or (443 if url.scheme == "https" else 80)
        except ValueError:
            return None
        below = sorted((o for o in scanned.values() if o.root_pid in roots and o.pid not in roots),
                       key=lambda o: o.depth)
        owner = listener.port_owner(port, [*sorted(roots), *(o.pid for o in below)])
        if owner is None:
            return None
        found = owner if owner in roots else scanned[owner].root_pid
        if found is None:
            return None
        self._metrics_owner = (owner, found)
        return found

    def process_list(self) -> list[dict[str, Any]]:
        """Every known process: the scan's while serving and draining, the kill's outcomes
        over them once it runs, the kill's alone at ``done``."""
        c = self.coordinator
        merged: dict[int, ProcessOutcome] = dict(c.scan.scanned)
        drain = c.controller.drain or c.controller.last
        if drain is not None and c.machine.phase.killing_or_done:
            if c.machine.phase is Phase.DONE:
                merged = {}
            for outcome in drain.outcomes.values():
                merged[outcome.pid] = outcome
        return [process_entry(o) for o in sorted(merged.values(), key=lambda o: o.pid)]

    def _processes_json(self) -> tuple[bytes, bytes]:
        cached = self._processes
        if cached is not None and cached[0] == self._processes_epoch and \
                self.coordinator.settings.status_cache:
            return cached[1], cached[2]
        processes = self.process_list()
        encoded = (json.dumps(_counts(processes), separators=(",", ":")).encode(),
                   json.dumps(processes, separators=(",", ":")).encode())
        self._processes = (self._processes_epoch, *encoded)
        return encoded


def _counts(entries: list[dict[str, Any]]) -> dict[str, int]:
    counts = {fate.value: 0 for fate in Fate}
    for entry in entries:
        counts[entry["fate"]] += 1
    return counts
