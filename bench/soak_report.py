"""The chaos soak's resource samples and final table (``bench/soak.py``)."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.soak_kinds import Kind
from bench.soak_rig import SoakPod, stat_fields

if TYPE_CHECKING:
    from bench.soak import Soak

RSS_SLACK_KIB = 8 * 1024
FD_SLACK = 8
GROWTH = 1.25
"""Flat: the mean of the last 10 % of samples <= GROWTH x the first 10 %'s + the slack."""


@dataclass
class Series:
    """One coordinator process's samples, taken after each drain."""

    pod: str
    pid: int
    rss_kib: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)


@dataclass
class Resources:
    """RSS and open fds of every coordinator; the machine's load average; CPU time."""

    series: dict[tuple[str, int], Series] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the coordinators and routers, read from /proc before each one ends."""

    def note_cpu(self, what: str, pid: int) -> None:
        """Add ``pid``'s CPU time so far to ``what`` (call just before it ends)."""
        fields = stat_fields(pid)
        if fields is not None:
            seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            self.cpu_s[what] = self.cpu_s.get(what, 0.0) + seconds

    def sample(self, pods: list[SoakPod]) -> None:
        self.load.append(os.getloadavg()[0])
        for pod in pods:
            pid = pod.coordinator.proc.pid
            got = _rss_and_fds(pid)
            if got is None:
                continue
            series = self.series.setdefault((pod.name, pid), Series(pod.name, pid))
            series.rss_kib.append(got[0])
            series.fds.append(got[1])


def _rss_and_fds(pid: int) -> tuple[int, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")), 0)
    return rss, fds


def trend(values: list[int], slack: float) -> tuple[float, float, float, bool]:
    """(first-10 % mean, last-10 % mean, their ratio, flat) of ``values``."""
    n = max(1, len(values) // 10)
    first, last = statistics.fmean(values[:n]), statistics.fmean(values[-n:])
    return first, last, last / first if first else float("inf"), last <= GROWTH * first + slack


# --- the table ------------------------------------------------------------------------------

COLUMNS = ("kind", "drains", "requests", "lost", "lost*", "tok miss", "tok dup", "inexact",
           "left", "untrue", "unexp", "errors", "outcomes")
FAILING = ("lost", "tok miss", "tok dup", "inexact", "left", "untrue", "unexp", "errors")


def report(args: argparse.Namespace, soak: Soak, kinds: list[Kind]) -> int:
    """Print the table and the resource figures; returns the exit status."""
    results = soak.results
    rows: list[list[str]] = []
    totals: Counter[str] = Counter()
    for kind in kinds:
        mine = [r for r in results if r.kind == kind.name]
        lost = sum(r.lost for r in mine)
        row = {"drains": len(mine), "requests": sum(r.requests for r in mine),
               "lost": lost, "lost*": sum(r.lost_allowed for r in mine),
               "tok miss": sum(r.tokens_missing for r in mine),
               "tok dup": sum(r.tokens_duplicated for r in mine),
               "inexact": sum(r.inexact for r in mine), "left": sum(len(r.left) for r in mine),
               "untrue": sum(bool(r.untruthful) for r in mine),
               "unexp": sum(r.unexpected for r in mine),
               "errors": sum(bool(r.errors) for r in mine)}
        totals.update(row)
        outcomes = Counter(r.outcome or "none" for r in mine)
        rows.append([kind.name, *(str(row[c]) for c in COLUMNS[1:-1]),
                     ", ".join(f"{o} {n}" for o, n in outcomes.most_common())])
    rows.append(["total", *(str(totals[c]) for c in COLUMNS[1:-1]), ""])
    elapsed = time.monotonic() - soak.began
    print(f"\nchaos soak: {len(results)} drains of {args.drains} asked for in {elapsed:.0f} s "
          f"(after {soak.began - soak.created:.0f} s to start the fleet; "
          f"seed {args.seed}, {args.pods} pods, up to {args.parallel} draining at once, "
          f"{args.streams} streams x {args.max_tokens} tokens per drain)")
    print(_table(rows))
    print("lost: streams without [DONE], where the router watches the coordinators; lost*: the "
          "same while a force or crash drain ran (of any pod), where losing requests is "
          "allowed (nothing hands them back first); tok miss/dup: tokens missing or duplicated "
          "in completed streams; "
          "inexact: completed streams with every token, out of order; left: engine processes "
          "still running after the drain; untrue: summaries that differ from the truth; unexp: "
          "outcomes other than the kind's (" + ", ".join(
              f"{k.name} {k.outcome}" for k in kinds if k.outcome != "graceful")
          + ", graceful otherwise); errors: drains with a step that went wrong")
    flat = _print_resources(soak)
    load = soak.resources.load
    if load:
        print(f"load average (1 min) during the run: min {min(load):.2f}, mean "
              f"{statistics.fmean(load):.2f}, max {max(load):.2f} on {os.cpu_count()} CPUs")
    _print_router(soak.router_stats)
    _print_cpu(soak, len(results))
    missing = [k.name for k in kinds if not any(r.kind == k.name for r in results)]
    uncovered = bool(missing) and args.drains >= len(kinds)
    problems = [f"{totals[c]} {c}" for c in FAILING if totals[c]]
    problems += [f"not flat: {what}" for what in flat]
    problems += [f"kinds that never ran: {', '.join(missing)}"] if uncovered else []
    problems += soak.fatal
    if not results:
        problems.append("no drain ran")
    print("result: " + ("PASS" if not problems else "FAIL — " + "; ".join(problems)))
    return 1 if problems else 0


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]
    lines = []
    for row in [list(COLUMNS), *rows]:
        cells = [row[0].ljust(widths[0]),
                 *(str(v).rjust(w) for v, w in zip(row[1:-1], widths[1:-1], strict=True)),
                 row[-1]]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def _print_resources(soak: Soak) -> list[str]:
    """Print the coordinators' RSS and fd figures; returns what is not flat."""
    not_flat: list[str] = []
    restart_pod = soak.fleet.pods[-1].name
    print("coordinators (sampled after every drain; flat: last-10 % mean <= "
          f"{GROWTH} x first-10 % mean + {RSS_SLACK_KIB // 1024} MiB / {FD_SLACK} fds)")
    for (pod, pid), s in sorted(soak.resources.series.items()):
        long_lived = pod != restart_pod
        rss = trend(s.rss_kib, RSS_SLACK_KIB)
        fds = trend(s.fds, FD_SLACK)
        judged = "" if long_lived else " (restarted by the coordinator_restart kind: not judged)"
        print(f"  {pod} pid {pid}, {len(s.rss_kib)} samples{judged}")
        print(f"    RSS MiB  first {s.rss_kib[0] / 1024:6.1f}  last {s.rss_kib[-1] / 1024:6.1f}  "
              f"max {max(s.rss_kib) / 1024:6.1f}  10 % means {rss[0] / 1024:.1f} -> "
              f"{rss[1] / 1024:.1f} (x{rss[2]:.2f}) {'flat' if rss[3] else 'GROWING'}")
        print(f"    fds      first {s.fds[0]:6d}  last {s.fds[-1]:6d}  max {max(s.fds):6d}  "
              f"10 % means {fds[0]:.1f} -> {fds[1]:.1f} (x{fds[2]:.2f}) "
              f"{'flat' if fds[3] else 'GROWING'}")
        if long_lived and not rss[3]:
            not_flat.append(f"{pod} RSS")
        if long_lived and not fds[3]:
            not_flat.append(f"{pod} fds")
    restarts = soak.fleet.pods[-1].coordinator_restarts
    print(f"  {restart_pod}'s coordinator was restarted {restarts} times; the router "
          f"{soak.fleet.router_restarts} times")
    return not_flat


def _print_router(stats: list[dict[str, Any]]) -> None:
    total: Counter[str] = Counter()
    for s in stats:
        total.update({k: int(v) for k, v in s.items() if isinstance(v, int)})
    if total:
        print(f"router (all its runs): {total['requests']} requests; {total['handed_back']} "
              f"handed-back and {total['broken']} broken upstream streams continued elsewhere; "
              f"{total['failed']} failed")


def _print_cpu(soak: Soak, drains: int) -> None:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = mine.ru_utime + mine.ru_stime
    reaped = children.ru_utime + children.ru_stime
    cpu = soak.resources.cpu_s
    others = sum(cpu.values())
    total = own + reaped + others
    parts = ", ".join(f"{what} {s:.0f} s" for what, s in sorted(cpu.items()))
    print(f"CPU time: {total:.0f} s ({total / max(drains, 1):.2f} s per drain): this process "
          f"{own:.0f} s; the engines, restarted coordinators and routers {reaped:.0f} s; the "
          f"last {parts}")
