"""Adoption of engines that never register: by PID, or by a command-line pattern.

Adopted trees are discovered at start-up (for ``/status``) and again when the kill starts, since
an unmodified engine may have restarted in between. Only the topmost match of a pattern becomes
a root: its matching descendants belong to its tree anyway. Command lines are read as the kill
engine reads them for its tier patterns (``procfs.cmdline``), so a pattern matches the same
processes whichever of the two looks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from coordinator.errors import RefusedTarget, TargetNotFound
from coordinator.kill import patterns, procfs, safety
from coordinator.kill.identity import ProcessFacts, descends_from, vet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptionRules:
    """What to adopt: explicit PIDs and command-line patterns (searched, not matched)."""

    pids: tuple[int, ...] = ()
    patterns: tuple[str, ...] = ()
    confine_to: int | None = None

    @property
    def empty(self) -> bool:
        return not self.pids and not self.patterns


def _pattern_matches(compiled: list[Any], protected: frozenset[int]) -> list[int]:
    found: list[int] = []
    for pid in procfs.pids():
        if pid in protected:
            continue
        cmdline = procfs.cmdline(pid)
        if cmdline and any(p.search(cmdline) for p in compiled):
            found.append(pid)
    return found


def _topmost(wanted: Iterable[int], vet_one: Callable[[int], ProcessFacts | None]
             ) -> list[ProcessFacts]:
    """The candidates that ``vet_one`` accepts and that descend from no other accepted one.

    Shallowest first, a candidate is vetted only when no ancestor of it was accepted: an
    engine whose hundreds of forks match the pattern (they share its command line) vets its
    main process alone, not every fork. Each candidate's parent is read once, every other
    ancestor once for all chains."""
    parent = procfs.ParentMap()
    for pid in wanted:
        try:
            stat = procfs.read_stat(pid)
        except OSError:
            continue
        if stat is not None:  # else gone: nothing to adopt
            parent[pid] = stat.ppid
    candidates = list(parent)
    chains: dict[int, list[int]] = {}
    for pid in candidates:
        try:
            chains[pid] = procfs.chain(pid, parent)
        except OSError:
            continue
    accepted: dict[int, ProcessFacts] = {}
    for pid in sorted(chains, key=lambda p: (len(chains[p]), p)):
        if any(ancestor in accepted for ancestor in chains[pid]):
            continue
        found = vet_one(pid)
        if found is not None:
            accepted[pid] = found
    return sorted(accepted.values(), key=lambda f: f.pid)


def discover(rules: AdoptionRules, *, exclude: Iterable[int] = ()) -> list[ProcessFacts]:
    """The roots of the trees ``rules`` adopt right now (refused processes are skipped)."""
    if rules.empty:
        return []
    protected = safety.protected_pids()
    compiled = [patterns.compile_pattern(p) for p in rules.patterns]
    wanted = list(rules.pids)
    if compiled:
        wanted.extend(_pattern_matches(compiled, protected))
    excluded = set(exclude)

    def vet_one(pid: int) -> ProcessFacts | None:
        try:
            return vet(pid, confine_to=rules.confine_to, protected=protected)
        except RefusedTarget as exc:
            # A pattern's match outside the confinement is another engine of the host (the
            # coordinator as an engine's init sees its neighbours): not a candidate, and no
            # warning at every scan. A PID named explicitly is the operator's, and warned of.
            outside = (pid not in rules.pids and rules.confine_to is not None
                       and not descends_from(pid, rules.confine_to))
            log.log(logging.DEBUG if outside else logging.WARNING, "not adopting: %s", exc)
        except TargetNotFound:
            pass
        return None

    return _topmost((pid for pid in dict.fromkeys(wanted) if pid not in excluded), vet_one)
