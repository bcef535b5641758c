"""What the log keeps of each drain: one line per process fate and one for the drain (key=value,
``coordinator.logfmt``). Once the pod is gone its ``/status`` is gone too; a log collector
keeps these."""

from __future__ import annotations

import logging
import time

from coordinator.drain.record import DrainRecord
from coordinator.kill.report import Fate
from coordinator.logfmt import logfmt

log = logging.getLogger(__name__)


def drain_ended(drain: DrainRecord, migrations: dict[str, int]) -> None:
    """One line per process fate and one for the drain: once the pod is gone, its log is what
    is left of how each process ended."""
    started = drain.deadlines.started_at
    for outcome in sorted(drain.outcomes.values(), key=lambda o: o.pid):
        level = logging.INFO if outcome.fate in (Fate.EXITED, Fate.GONE) else logging.WARNING
        if not log.isEnabledFor(level):
            continue  # a line per process, built only where it is written
        log.log(level, "drain process: %s", logfmt({
            "pid": outcome.pid, "name": outcome.name, "role": outcome.role,
            "root_pid": outcome.root_pid, "tier": outcome.tier, "fate": outcome.fate.value,
            "signal": outcome.signal, "exit_code": outcome.exit_code,
            "elapsed_ms": None if outcome.elapsed_ms is None else round(outcome.elapsed_ms, 1),
            "detail": outcome.detail or None}))
    fates = {fate.value: 0 for fate in Fate}
    for outcome in drain.outcomes.values():
        fates[outcome.fate.value] += 1
    graceful = drain.outcome in ("graceful", "aborted")
    log.log(logging.INFO if graceful else logging.WARNING, "drain end: %s", logfmt({
        "outcome": drain.outcome, "reason": drain.reason,
        "seconds": round((drain.ended_at or time.time()) - started, 3),
        "budget_s": round(drain.split.total_s, 3), "processes": len(drain.outcomes),
        **fates, "handed_back": migrations["handed_back"], "lost_requests": drain.lost_requests,
        "causes": " | ".join(drain.causes) or None,
        "errors": " | ".join(drain.errors) or None}))
