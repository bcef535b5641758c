"""Adoption of engines that never register: by PID, or by a command-line pattern.

Adopted trees are discovered at start-up (for ``/status``) and again when the kill starts, since
an unmodified engine may have restarted in between. Only the topmost match of a pattern becomes
a root: its matching descendants belong to its tree anyway. Command lines are read as the kill
engine reads them for its tier patterns (``procfs.cmdline``), so a pattern matches the same
processes whichever of the two looks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
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


def _pattern_matches(compiled: list[Any]) -> list[int]:
    protected = safety.protected_pids()
    found: list[int] = []
    for pid in procfs.pids():
        if pid in protected:
            continue
        cmdline = procfs.cmdline(pid)
        if cmdline and any(p.search(cmdline) for p in compiled):
            found.append(pid)
    return found


def _topmost(candidates: Iterable[ProcessFacts]) -> list[ProcessFacts]:
    chosen = {c.pid: c for c in candidates}
    roots: list[ProcessFacts] = []
    for candidate in chosen.values():
        try:
            if procfs.read_stat(candidate.pid) is None:
                continue  # gone since it was vetted
            ancestors = set(procfs.ancestors(candidate.pid))
        except OSError:
            continue
        if not ancestors & chosen.keys():
            roots.append(candidate)
    return sorted(roots, key=lambda f: f.pid)


def discover(rules: AdoptionRules, *, exclude: Iterable[int] = ()) -> list[ProcessFacts]:
    """The roots of the trees ``rules`` adopt right now (refused processes are skipped)."""
    if rules.empty:
        return []
    compiled = [patterns.compile_pattern(p) for p in rules.patterns]
    wanted = list(rules.pids)
    if compiled:
        wanted.extend(_pattern_matches(compiled))
    excluded = set(exclude)
    vetted: list[ProcessFacts] = []
    for pid in dict.fromkeys(wanted):
        if pid in excluded:
            continue
        try:
            vetted.append(vet(pid, confine_to=rules.confine_to))
        except RefusedTarget as exc:
            # A pattern's match outside the confinement is another engine of the host (the
            # coordinator as an engine's init sees its neighbours): not a candidate, and no
            # warning at every scan. A PID named explicitly is the operator's, and warned of.
            outside = (pid not in rules.pids and rules.confine_to is not None
                       and not descends_from(pid, rules.confine_to))
            log.log(logging.DEBUG if outside else logging.WARNING, "not adopting: %s", exc)
        except TargetNotFound:
            continue
    return _topmost(vetted)
