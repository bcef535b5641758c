"""``shutdown-coordinator kill``: the ordered graceful kill, without the service.

For hosts and break-glass moments where no coordinator runs: terminate process trees given by
PID or by a command-line pattern, in order (deepest first, each root last), and print how
every process ended. ``--force`` is the operator's quick stop: SIGKILL everything at once.

Exit codes are the ``drain`` command's: 0 all graceful, 3 something needed SIGKILL, 4 something
survived, 8 a target was refused (PID 1, this process, an ancestor) and nothing was signalled,
14 nothing to end (every target already gone, or no process matching).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from coordinator import exit_codes

if TYPE_CHECKING:
    from coordinator.kill import KillReport


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``kill`` subcommand."""
    kill = sub.add_parser("kill", help="terminate process trees in order, without a coordinator")
    kill.add_argument("pids", nargs="*", type=int, metavar="PID", help="root processes")
    kill.add_argument("--pattern", action="append", default=[], metavar="REGEX",
                      help="also every topmost process whose command line matches (repeatable)")
    kill.add_argument("--force", action="store_true",
                      help="SIGKILL everything at once (no graceful tier)")
    kill.add_argument("--tier-timeout", type=float, default=10.0, metavar="S",
                      help="seconds per tier between SIGTERM and SIGKILL (default 10)")
    kill.add_argument("--deadline", type=float, default=30.0, metavar="S",
                      help="overall budget in seconds (default 30)")
    kill.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the ``kill`` subcommand; returns the exit code."""
    # Imported here: every other subcommand (and the preStop path) starts without them.
    import asyncio

    from coordinator.errors import RefusedTarget
    from coordinator.kill import KillPolicy, Target, terminate
    from coordinator.kill.adoption import AdoptionRules, discover
    from coordinator.kill.patterns import PatternError, compile_pattern

    if not args.pids and not args.pattern:
        print("kill: give at least one PID or --pattern", file=sys.stderr)
        return exit_codes.USAGE
    if args.tier_timeout <= 0 or args.deadline <= 0:
        print("kill: --tier-timeout and --deadline must be positive", file=sys.stderr)
        return exit_codes.USAGE
    try:
        for pattern in args.pattern:
            compile_pattern(pattern)
    except PatternError as exc:
        print(f"kill: bad --pattern: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    patterns = tuple(args.pattern)
    targets = [Target(pid=pid, role="root") for pid in args.pids]
    known = set(args.pids)
    for root in discover(AdoptionRules(patterns=patterns), exclude=known):
        targets.append(Target(pid=root.pid, start_time=root.start_time, role="matched"))
    if not targets:
        print("kill: no process matches: nothing to end", file=sys.stderr)
        return exit_codes.NOTHING_TO_DRAIN
    policy = KillPolicy(tier_timeout_s=args.tier_timeout, deadline_s=args.deadline,
                        force=args.force)
    try:
        report = asyncio.run(terminate(targets, policy))
    except RefusedTarget as exc:
        print(f"kill: {exc}; nothing was signalled", file=sys.stderr)
        return exit_codes.REFUSED
    print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    code = exit_code(report)
    if code == exit_codes.NOTHING_TO_DRAIN:
        print("kill: every target was already gone: nothing to end", file=sys.stderr)
    return code


def exit_code(report: KillReport) -> int:
    """``drain``'s exit codes for a kill report: ``NOTHING_TO_DRAIN`` when every process was
    already gone (no target was running: nothing was ended)."""
    from coordinator.kill import Fate

    fates = {p.fate for p in report.processes}
    if Fate.SURVIVED in fates or Fate.RUNNING in fates:
        return exit_codes.SURVIVED
    if Fate.KILLED in fates:
        return exit_codes.KILLED
    if fates <= {Fate.GONE}:
        return exit_codes.NOTHING_TO_DRAIN
    return exit_codes.OK


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves: the kill runs in this process, so it stops where it was."""
    return ("the kill stopped where it was: processes it signalled may still be exiting, "
            "the rest were not signalled; run the same command again to end what is left "
            "(with --force: SIGKILL at once)")


def render(report: KillReport) -> str:
    """The report as a table (the ``status`` table style), in the order processes ended."""
    from coordinator.service.render import shown, table

    rows = [[p.pid, p.depth, p.fate.value, p.signal, None if p.elapsed_ms is None
             else f"{p.elapsed_ms:.0f}", "?" if p.exit_code is None else p.exit_code,
             (p.cmdline or p.name)[:60]]
            for p in sorted(report.processes, key=lambda p: (p.ended_at or float("inf"), p.pid))]
    lines = [table(["pid", "depth", "fate", "signal", "after ms", "exit", "command"], rows)]
    counts = ", ".join(f"{n} {fate}" for fate, n in report.counts().items() if n)
    lines.append(f"{len(report.processes)} processes: {counts} "
                 f"({report.mode}, exits seen by {report.exit_detection})")
    lines.extend(f"note: {shown(note)}" for note in report.notes)
    return "\n".join(lines)
