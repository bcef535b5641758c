"""What callers left behind expires while no drain runs.

Every collection a caller can grow has a bound (``--max-*``, a 429 past it) and an end. During
a drain the drain's budget ends pending handoffs (``budget_ended``) and its end forgets early
acknowledgements. Outside a drain nothing else would, so every ``interval`` seconds, while the
phase is ``serving``:

    1. pending handoffs older than ``--expire-after`` are dropped and counted ``expired`` (a
       router that has not re-issued one by then never will);
    2. early acknowledgements older than that are dropped (their handoff never came);
    3. workers whose process exited longer ago than that are forgotten, once no process
       listed under them still runs (what a crashed worker left behind stays known, and is
       taken by the next drain's kill, for as long as it runs).

Held-open streams and long-polls end by themselves (the worker's exit, ``--long-poll-cap``),
and connections by ``--read-timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.drain.phases import Phase

if TYPE_CHECKING:
    from coordinator.service.runtime import Coordinator

log = logging.getLogger(__name__)

MAX_INTERVAL_S = 5.0
"""Longest pause between two sweeps: an expired item lives at most this long past its time."""


@dataclass(frozen=True)
class Swept:
    """What one sweep removed."""

    handoffs: int = 0
    early_acks: int = 0
    workers: int = 0

    def __bool__(self) -> bool:
        return bool(self.handoffs or self.early_acks or self.workers)


def sweep(coordinator: Coordinator, now: float) -> Swept:
    """One sweep at ``now`` (epoch s); does nothing unless the phase is ``serving``."""
    if coordinator.machine.phase is not Phase.SERVING:
        return Swept()
    cutoff = now - coordinator.settings.expire_after_s
    # 1 and 2
    handoffs, early = coordinator.migrations.expire_before(cutoff)
    if handoffs:
        coordinator.metrics.migrations.labels("expired").inc(handoffs)
    # 3
    still_running = {o.root_pid for o in coordinator.scan.scanned.values()}
    stale = [w.id for w in coordinator.registry.workers.values()
             if not w.alive and w.exited_at is not None and w.exited_at < cutoff
             and w.pid not in still_running]
    for worker_id in stale:
        coordinator.deregister(worker_id)
    swept = Swept(handoffs, early, len(stale))
    if swept:
        log.info("expired while serving: %d handoffs, %d early acknowledgements, "
                 "%d exited workers", handoffs, early, len(stale))
        coordinator.bump()
    return swept


def interval(expire_after_s: float) -> float:
    """Seconds between sweeps: a quarter of the expiry, at most ``MAX_INTERVAL_S``."""
    return min(MAX_INTERVAL_S, expire_after_s / 4)


async def sweep_forever(coordinator: Coordinator) -> None:
    """``sweep`` every ``interval`` seconds until cancelled; a failed sweep is logged."""
    pause = interval(coordinator.settings.expire_after_s)
    while True:
        await asyncio.sleep(pause)
        try:
            sweep(coordinator, time.time())
        except Exception:
            log.exception("expiry sweep failed")
