"""``shutdown-coordinator drain``: start a drain on a running coordinator, follow it to its end,
print the summary, and exit with the outcome's code."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from coordinator import exit_codes
from coordinator.cli.client_errors import client_errors_to_exit_codes
from coordinator.cli.client_flags import add_client_flags, read_token, same_coordinator
from coordinator.cli.status import drain_ended

if TYPE_CHECKING:
    from coordinator.service.client import CoordinatorClient

RECONNECT_S = 15.0
"""How long ``drain`` keeps retrying a coordinator that went away (it may be restarting)."""
REDRAW_S = 1.0
"""On a terminal, ``drain`` redraws its progress line at least this often (seconds), so the
budget left and the countdown to a waited-on process's SIGKILL keep moving between changes;
in a log it writes one line per change only."""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 (excluded) and 86400 s")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``drain`` subcommand."""
    drain = sub.add_parser("drain", help="drain a running coordinator and print the summary")
    add_client_flags(drain)
    drain.add_argument("--reason", default="operator", help="why (shown in /status)")
    drain.add_argument("--deadline", type=_positive_seconds, default=None, metavar="S",
                       help="a shorter budget for this drain, in seconds")
    drain.add_argument("--quiet", action="store_true", help="no progress lines")
    how = drain.add_mutually_exclusive_group()
    how.add_argument("--force", action="store_true",
                     help="skip migration and SIGKILL every process at once; escalates a "
                     "drain that is already running")
    how.add_argument("--abort", action="store_true",
                     help="abort the running drain instead (DELETE /drain): serving again, "
                     "possible until it terminates processes; also ends the cycle of a "
                     "drain that found nothing to drain")


@client_errors_to_exit_codes
def run(args: argparse.Namespace) -> int:
    """Run the ``drain`` subcommand; returns the exit code of the drain's outcome."""
    from coordinator.service.client import CoordinatorClient
    from coordinator.service.render import drain_verdict, status_text

    with CoordinatorClient(args.url, read_token(args)) as client:
        if args.abort:
            return _abort(client, args)
        started = client.start_drain(args.reason, args.deadline, force=args.force)
        args.drain_started = True  # for ``interrupted``
        document = _follow(client, args, since=int(started["generation"]) - 1)
    outcome, causes, _ = drain_verdict(document)
    outcome = outcome or "survived"
    print(json.dumps(document, indent=2) if args.json else status_text(document))
    if outcome == "nothing_to_drain":
        # Always on stderr, even with --json or --quiet: a drain that ended nothing usually
        # means a deployment mistake (no worker registered, an adoption pattern that misses).
        why = " ".join(causes) or "no process was registered or adopted."
        print(f"warning: nothing to drain: {why}", file=sys.stderr)
        print("warning: the coordinator stays out of rotation (/readyz 503) until a worker "
              "registers; `shutdown-coordinator drain --abort"
              f"{same_coordinator(args)}` puts it back", file=sys.stderr, flush=True)
    return exit_codes.OUTCOME_CODES.get(outcome, exit_codes.SURVIVED)


def _abort(client: CoordinatorClient, args: argparse.Namespace) -> int:
    """``--abort``: the running drain aborted, or the cycle of a drain that found nothing
    to drain ended; a drain that terminates (or terminated) processes is refused (409)."""
    answer = client.abort_drain()
    if args.json:
        print(json.dumps(answer, indent=2))
    elif answer.get("aborted"):
        print(f"aborted: the coordinator is serving again (generation {answer['generation']})")
    else:
        print("the drain had nothing to drain: the coordinator is serving again "
              f"(generation {answer['generation']})")
    return exit_codes.OK


def interrupted(args: argparse.Namespace) -> str:
    """What goes on after Ctrl-C: the drain, in the coordinator, and how to follow or
    abort it."""
    again = same_coordinator(args)
    if args.abort:
        return ("the abort may or may not have reached the coordinator: "
                f"`shutdown-coordinator status{again}` tells")
    follow = f"`shutdown-coordinator status --watch{again}` follows it"
    abort = f"`shutdown-coordinator drain --abort{again}` aborts it"
    phase = (getattr(args, "followed", None) or {}).get("phase")
    if not getattr(args, "drain_started", False):
        return (f"the drain may have started in the coordinator at {args.url}: {follow}, "
                f"{abort} until it terminates processes")
    if phase in ("terminating", "done"):
        return (f"the drain goes on in the coordinator at {args.url}, terminating processes "
                f"(too late to abort): {follow}")
    return (f"the drain goes on in the coordinator at {args.url}: {follow}, {abort} until "
            "it terminates processes")


def _follow(client: CoordinatorClient, args: argparse.Namespace, *,
            since: int) -> dict[str, Any]:
    """Long-poll ``/status`` from generation ``since`` until the drain ends, printing progress
    on stderr; returns the last document."""
    from coordinator.service.client import ClientError
    from coordinator.service.render import progress_line

    tty = sys.stderr.isatty()
    redraw = tty and not args.quiet and not args.json
    columns = shutil.get_terminal_size().columns - 1
    lost_at: float | None = None
    while True:
        try:
            document = client.status(wait=REDRAW_S if redraw else 10.0, since=since)
            lost_at = None
        except ClientError:
            # The coordinator may be restarting (it resumes the drain): retry a while.
            lost_at = lost_at or time.monotonic()
            if time.monotonic() - lost_at > RECONNECT_S:
                raise
            time.sleep(0.2)
            continue
        generation = int(document["generation"])
        args.followed = document  # for ``interrupted``
        if redraw:
            # On a terminal one line is rewritten in place, also when nothing changed (its
            # countdowns move); in a log, one line a change.
            print("\r\x1b[K" + progress_line(document, width=columns), end="",
                  file=sys.stderr, flush=True)
        elif generation > since and not args.quiet and not args.json:
            print(progress_line(document), file=sys.stderr, flush=True)
        since = max(since, generation)
        if drain_ended(document):
            break
    if redraw:
        print(file=sys.stderr)
    return document
