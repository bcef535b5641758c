"""What ``bench/group.py`` counts, as pure functions of ground truth (made-up records in
``tests/bench/test_group_bench.py`` hold them):

- **requests lost**: the clients' streams that did not arrive whole and exact against
  ``devstack.sim.expected_tokens`` (``ClientStream.exact``: ``[DONE]`` and exactly the
  engine's tokens for the prompt, in order);
- **streams broken at the leader**: upstream streams from the leader's front end that ended
  with neither ``[DONE]`` nor a hand-back, as the router that received them counts them
  (``broken`` in its ``/stats``). The reference router continues a broken stream from the
  text already streamed, as it does a handed-back one, so its clients may lose none of these;
  a router that cannot (one without a continuation layer) loses each;
- **how each process of each pod ended**: a pod's main process by ``waitpid`` (the bench is
  its parent); any other process by its parent's ``waitpid`` as the parent recorded it
  (``children_exit_codes``), else by its own end record; neither means it was killed with no
  one left to see it (the leader's main SIGKILLs its tree and itself when rank 0 dies);
- **ranks crashed**: ranks whose exit code is not 0 (an abort, a kill, or none recorded), with
  the cause their own record gives (``finished``, ``left on SIGTERM``, ``collective timed
  out``; ``killed`` when it never wrote one);
- **time to empty**: from the first preStop hook's call to the last process of every pod
  ended, from the bench's own polling of ``/proc``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devstack.sim.roles import Role
from devstack.streaming_load import ClientStream

KILLED = "killed"
"""A rank's cause when it wrote none: it was SIGKILLed (nothing can record that)."""
UNKNOWN = "?"
"""How an exit code no one saw is shown."""


@dataclass(frozen=True)
class Proc:
    """One process of a pod as the pod came up (its ready file)."""

    pid: int
    role: str
    """``devstack.sim.roles.Role``: ``main``, ``scheduler`` (a rank), ``detokenizer``."""
    rank: int | None = None


@dataclass(frozen=True)
class PodTruth:
    """One pod after the drain: what the bench saw and what its processes wrote."""

    index: int
    main_pid: int
    main_code: int | None
    """Its main process's status from ``waitpid`` (``Popen.returncode``; -N: signal N);
    None while it runs."""
    processes: tuple[Proc, ...]
    records: tuple[dict[str, Any], ...]
    """Every end record in the pod's record directory (``devstack.sim.records``)."""


@dataclass(frozen=True)
class ProcessEnd:
    """How one process of one pod ended."""

    pod: int
    pid: int
    role: str
    rank: int | None
    exit_code: int | None
    """None: no one saw it end (no waitpid, no record)."""
    seen_by: str
    """``waitpid`` (the bench's), ``parent`` (its parent's waitpid, recorded), ``own record``,
    or ``nobody``."""
    cause: str | None
    """A rank's cause (its own record's, ``killed`` without one); None for other processes."""

    @property
    def is_rank(self) -> bool:
        return self.role == Role.SCHEDULER.value

    @property
    def crashed(self) -> bool:
        """A rank that did not exit 0: aborted, killed, or never seen to end."""
        return self.is_rank and self.exit_code != 0


def process_ends(pod: PodTruth) -> list[ProcessEnd]:
    """How every process of ``pod`` ended (module docstring: whose word counts, in order)."""
    records = {r.get("pid"): r for r in pod.records}
    main_record = records.get(pod.main_pid) or {}
    by_parent: Mapping[str, int | None] = main_record.get("children_exit_codes") or {}
    ends = []
    for proc in pod.processes:
        own = records.get(proc.pid) or {}
        code: int | None
        if proc.pid == pod.main_pid:
            code, seen_by = pod.main_code, "waitpid"
        elif by_parent.get(str(proc.pid)) is not None:
            code, seen_by = by_parent[str(proc.pid)], "parent"
        elif own.get("ended_at") is not None and own.get("exit_code") is not None:
            code, seen_by = int(own["exit_code"]), "own record"
        else:
            code, seen_by = None, "nobody"
        if code is None and seen_by == "waitpid":
            seen_by = "nobody"
        cause = None
        if proc.role == Role.SCHEDULER.value:
            cause = own.get("cause") or KILLED
        ends.append(ProcessEnd(pod.index, proc.pid, proc.role, proc.rank, code, seen_by, cause))
    return ends


def lost(streams: Iterable[ClientStream]) -> list[ClientStream]:
    """The streams that did not arrive whole and exact."""
    return [s for s in streams if not s.exact]


def tokens_damage(streams: Iterable[ClientStream]) -> tuple[int, int]:
    """(missing, duplicated) tokens over ``streams`` (``ClientStream.missing_duplicated``)."""
    missing = duplicated = 0
    for stream in streams:
        m, d = stream.missing_duplicated()
        missing += m
        duplicated += d
    return missing, duplicated


def time_to_empty(t0: float, ended_at: Mapping[int, float | None]) -> float | None:
    """Seconds from ``t0`` to the last process's end; None when one never ended (or there
    were none to watch, which would be a bench that watched nothing)."""
    if not ended_at or any(at is None for at in ended_at.values()):
        return None
    return max(at for at in ended_at.values() if at is not None) - t0


def code_label(code: int | None) -> str:
    return UNKNOWN if code is None else str(code)


def count_codes(ends: Iterable[ProcessEnd]) -> Counter[str]:
    return Counter(code_label(e.exit_code) for e in ends)


def count_causes(ends: Iterable[ProcessEnd]) -> Counter[str]:
    return Counter(e.cause or KILLED for e in ends if e.is_rank)


def format_counts(counts: Mapping[str, int]) -> str:
    """``0: 14, 6: 2, -6: 1, ?: 1`` (label: how many), most frequent first."""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{label}: {n}" for label, n in ordered if n) or "none"


@dataclass
class RunResult:
    """One drain of one group: every figure of a row of the table, before summing."""

    way: str
    scenario: str
    streams: int
    lost: int
    tokens_missing: int
    tokens_duplicated: int
    broken: int
    """Upstream streams broken, as the router counted them (its only worker is the leader:
    the spare takes continuations only)."""
    ends: list[ProcessEnd]
    empty_s: float | None
    """None: some process of the group had not ended within the bench's bound."""
    hooks_s: float
    """From the first hook's call to the last hook's answer."""
    verdicts: list[str] = field(default_factory=list)
    """Each coordinator's drain outcome, the leader's first (what the pods said of
    themselves, against which the records are the truth)."""

    @property
    def ranks(self) -> int:
        return sum(e.is_rank for e in self.ends)

    @property
    def crashed(self) -> int:
        return sum(e.crashed for e in self.ends)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass
class WayTotals:
    """Every run of one way in one scenario, summed."""

    way: str
    scenario: str
    runs: int
    streams: int
    lost: int
    tokens_missing: int
    tokens_duplicated: int
    broken: int
    ranks: int
    crashed: int
    causes: Counter[str]
    codes: Counter[str]
    pods_broken: int
    """Runs where some pod's main process did not exit 0."""
    empty_s: list[float]
    not_empty: int
    """Runs whose group had not emptied within the bound."""
    hooks_s: list[float]
    verdicts: Counter[str]

    @classmethod
    def of(cls, way: str, scenario: str, runs: Sequence[RunResult]) -> WayTotals:
        """The totals of the runs of ``way`` in ``scenario`` among ``runs``."""
        runs = [r for r in runs if (r.way, r.scenario) == (way, scenario)]
        ends = [e for r in runs for e in r.ends]
        return cls(
            way=way, scenario=scenario, runs=len(runs), streams=sum(r.streams for r in runs),
            lost=sum(r.lost for r in runs),
            tokens_missing=sum(r.tokens_missing for r in runs),
            tokens_duplicated=sum(r.tokens_duplicated for r in runs),
            broken=sum(r.broken for r in runs),
            ranks=sum(r.ranks for r in runs), crashed=sum(r.crashed for r in runs),
            causes=count_causes(ends), codes=count_codes(ends),
            pods_broken=sum(any(e.role == Role.MAIN.value and e.exit_code != 0 for e in r.ends)
                            for r in runs),
            empty_s=[r.empty_s for r in runs if r.empty_s is not None],
            not_empty=sum(r.empty_s is None for r in runs),
            hooks_s=[r.hooks_s for r in runs],
            verdicts=Counter(v for r in runs for v in r.verdicts),
        )


def ratio(baseline: float, project: float) -> str:
    """``baseline / project`` in words that stay true at zero."""
    if project == 0:
        return "none either" if baseline == 0 else f"{baseline:g} against none"
    return f"x{baseline / project:.2f}"


def comparison(per_pod: WayTotals, group: WayTotals) -> list[str]:
    """The ratios (per pod against the group drain, in one scenario), and plainly where the
    group drain is slower."""
    lines = [
        f"requests lost, per pod / group: {ratio(per_pod.lost, group.lost)} "
        f"({per_pod.lost} of {per_pod.streams} against {group.lost} of {group.streams})",
        f"streams broken at the leader, per pod / group: "
        f"{ratio(per_pod.broken, group.broken)} ({per_pod.broken} against {group.broken})",
        f"ranks crashed, per pod / group: {ratio(per_pod.crashed, group.crashed)} "
        f"({per_pod.crashed} of {per_pod.ranks} against {group.crashed} of {group.ranks})",
        f"runs where a pod's main process did not exit 0, per pod / group: "
        f"{per_pod.pods_broken} of {per_pod.runs} against {group.pods_broken} of {group.runs}",
    ]
    for what, a, b in (("time to empty", per_pod.empty_s, group.empty_s),
                       ("hooks returned", per_pod.hooks_s, group.hooks_s)):
        if not a or not b:
            lines.append(f"{what}: not comparable (a way never emptied)")
            continue
        pa, pb = median(a), median(b)
        if pb > pa:
            verdict = f"the group drain is SLOWER, by {pb - pa:.2f} s"
        else:
            verdict = f"the group drain is faster, by {pa - pb:.2f} s"
        lines.append(f"{what}, median: per pod {pa:.2f} s, group {pb:.2f} s "
                     f"(group / per pod x{pb / pa:.2f}): {verdict}")
    if per_pod.not_empty or group.not_empty:
        lines.append(f"runs not empty within the bound: per pod {per_pod.not_empty}, "
                     f"group {group.not_empty}")
    return [f"{group.scenario}: {line}" for line in lines]
