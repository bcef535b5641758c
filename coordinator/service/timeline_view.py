"""What ``GET /status/timeline`` draws, and the running drain's clock for the metrics.

The timeline of the ``current`` drain is the ``/status`` document as it is; of the ``last``
one (and of ``current`` while serving, after a drain), ``last_drain``'s record with its
processes. Both carry the drain's handoff events in time (``handoff_log``), which ``/status``
does not list, from the migration book's bounded log.
"""

from __future__ import annotations

import math
from typing import Any

from coordinator.drain.phases import Phase
from coordinator.service.process_scan import process_entry
from coordinator.service.runtime import Coordinator


def running_drain(coordinator: Coordinator) -> tuple[float, float] | None:
    """(seconds since it started, its budget in seconds) of the drain that runs, or None."""
    drain = coordinator.controller.drain
    if drain is None or coordinator.machine.phase in (Phase.SERVING, Phase.DONE):
        return None
    started = drain.deadlines.started_at
    return (max(coordinator.controller.clock() - started, 0.0),
            drain.deadlines.deadline_at - started)


def timeline_document(coordinator: Coordinator, which: str) -> dict[str, Any]:
    """The ``/status`` document the timeline draws: as it is for the ``current`` drain;
    with ``drain`` null and ``last_drain``'s processes for the ``last`` one (and for
    ``current`` while serving, after a drain); plus ``handoff_log``, the drain's handoff
    events in time, and ``migration_counts`` counted from them (the drain's own)."""
    document = coordinator.view.status_document()
    controller = coordinator.controller
    record = controller.drain if document["drain"] is not None else None
    if which == "last" or record is None:
        record = controller.last
        document["drain"] = None
        document["last_drain"] = record.to_status() if record is not None else None
        if record is not None:
            document["processes"] = [process_entry(o) for o in sorted(
                record.outcomes.values(), key=lambda o: o.pid)]
            document["workers"] = []  # a new cycle's: those of the last drain are forgotten
            document["migrations"] = []
    document["handoff_log"] = []
    if record is not None:
        start = record.deadlines.started_at
        end = record.ended_at if record.ended_at is not None else math.inf
        document["handoff_log"] = [{"at": at, "event": event, "count": count}
                                   for at, event, count in coordinator.migrations.log
                                   if start <= at <= end]
        # This drain's, not the coordinator's since it started.
        totals = {"handed_back": 0, "acked": 0, "expired": 0}
        for entry in document["handoff_log"]:
            totals[entry["event"]] += entry["count"]
        document["migration_counts"] = {**totals, "pending": len(document["migrations"])}
    return document
