"""A previous run's outcomes, for a restarted coordinator resuming a kill: step 3 of the kill,
and what step 8 reports of the processes this run never found.

A process the previous run already signalled keeps its tier, its signal and the times they
were sent, so it is not signalled again and its tier's timeout keeps counting. A process of the
previous run that this run does not find alive is reported as that run last saw it, settled.
Outcomes match on their own PID and start time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from coordinator.kill import procfs
from coordinator.kill.report import Fate, ProcessOutcome


def by_pid(prior: Iterable[ProcessOutcome]) -> dict[int, list[ProcessOutcome]]:
    """The previous run's outcomes, grouped by PID (a PID may have been reused)."""
    grouped: dict[int, list[ProcessOutcome]] = {}
    for outcome in prior:
        grouped.setdefault(outcome.pid, []).append(outcome)
    return grouped


def carry_over(now: ProcessOutcome, befores: Iterable[ProcessOutcome]) -> None:
    """Keep on ``now`` (a process just verified) what the previous run already did to it:
    the first of ``befores`` (the previous outcomes of its PID) with its start time."""
    assert now.start_time is not None
    for before in befores:
        if before.start_time is None or not procfs.same_start(
            before.start_time, now.start_time
        ):
            continue
        now.tier, now.signal = before.tier, before.signal
        now.signalled_at, now.killed_at = before.signalled_at, before.killed_at
        if before.role and not now.role:
            now.role = before.role
        return


def not_found(prior: Mapping[int, list[ProcessOutcome]],
              outcomes: list[ProcessOutcome]) -> list[ProcessOutcome]:
    """Outcomes of the previous run (``by_pid``) whose processes are not among ``outcomes``
    (this run's), copied and settled: ended while no coordinator was watching them."""
    out: list[ProcessOutcome] = []
    for pid, befores in prior.items():
        for before in befores:
            if any(
                o.pid == pid
                and o.start_time is not None
                and before.start_time is not None
                and procfs.same_start(o.start_time, before.start_time)
                for o in outcomes
            ):
                continue
            settled = ProcessOutcome.from_dict(before.to_dict())
            if not settled.fate.final:
                if settled.killed_at is not None:
                    settled.fate = Fate.KILLED
                elif settled.signalled_at is not None:
                    settled.fate = Fate.EXITED
                else:
                    settled.fate = Fate.GONE
                settled.detail = "ended while no coordinator was watching it"
            out.append(settled)
    return out
