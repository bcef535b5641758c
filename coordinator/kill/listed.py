"""Processes listed under a root before the kill that the kill itself never found.

A scan lists each registered or adopted tree while the pod serves. A root that dies between
the last look and the kill (a crash as the drain starts) takes its ``PR_SET_PDEATHSIG``
children with it, or they are reparented away: the kill's own discovery then finds the root
and nothing under it. Those processes were real, and the summary must still account for
each: ``gone`` when no process with its identity runs any more, ``survived`` when one still
does (it left the tree before the kill could reach it, and nothing stopped it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from coordinator.kill import procfs
from coordinator.kill.policy import Target
from coordinator.kill.report import Fate, ProcessOutcome


def still_running(outcomes: Iterable[ProcessOutcome]) -> bool:
    """Whether any of ``outcomes`` was settled ``survived`` (still running)."""
    return any(o.fate is Fate.SURVIVED for o in outcomes)


def listed_not_found(targets: Iterable[Target], found: Iterable[ProcessOutcome],
                     spared: Mapping[int, int] | None = None) -> list[ProcessOutcome]:
    """Each process of a target's ``listed`` whose identity (PID and start time) is not among
    ``found``, settled as the system shows it now.

    Not those the kill left alone on purpose (``spared``: PID to start ticks): a preStop hook
    in the engine's unit is listed by a scan taken before it connected, yet it is no process
    of the engine's, and its running on is no survival."""
    seen: dict[int, list[float]] = {}
    for o in found:
        if o.start_time is not None:
            seen.setdefault(o.pid, []).append(o.start_time)
    if spared:
        boot = procfs.boot_time()
        for pid, ticks in spared.items():
            seen.setdefault(pid, []).append(ticks / procfs.CLOCK_TICKS + boot)
    out: list[ProcessOutcome] = []
    for target in targets:
        for listed in target.listed:
            if listed.start_time is None or any(
                    procfs.same_start(start, listed.start_time)
                    for start in seen.get(listed.pid, ())):
                continue
            settled = ProcessOutcome.from_dict(listed.to_dict())
            stat = procfs.read_stat(listed.pid)
            if stat is not None and not stat.zombie and procfs.same_start(
                    stat.start_time(procfs.boot_time()), listed.start_time):
                settled.fate = Fate.SURVIVED
                settled.detail = (f"listed under pid {target.pid} before the kill, then outside "
                                  "its tree: the kill never reached it, and it still runs")
            else:
                settled.fate = Fate.GONE
                settled.detail = (f"listed under pid {target.pid} before the kill, gone when "
                                  "the kill looked (it ended with its root)")
            out.append(settled)
            seen.setdefault(listed.pid, []).append(listed.start_time)
    return out
