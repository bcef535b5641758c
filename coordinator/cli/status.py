"""``shutdown-coordinator status``: the coordinator's state, once or at every change, or the
kill as it would run now."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from coordinator import exit_codes
from coordinator.cli.client_errors import client_errors_to_exit_codes
from coordinator.cli.client_flags import add_client_flags, read_token, same_coordinator
from coordinator.cli.ending import reader_gone

if TYPE_CHECKING:
    from coordinator.service.client import CoordinatorClient


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``status`` subcommand."""
    status = sub.add_parser("status", help="print the coordinator's state")
    add_client_flags(status)
    status.add_argument("--plan", action="store_true",
                        help="print the kill as it would run now: tiers in order, each with "
                        "its signal, timeout and processes")
    status.add_argument("--watch", action="store_true",
                        help="print the state again at every change (a drain as it runs) "
                        "until interrupted, or until a drain is done")
    status.add_argument("--timeline", metavar="FILE.svg",
                        help="write the drain's timeline to FILE.svg (phases, a row per "
                        "process with its signals and exit, handoffs): the running drain, or "
                        "the latest while none runs; with --last-drain, last_drain")
    status.add_argument("--last-drain", action="store_true",
                        help="with --timeline: draw last_drain, the latest drain that ended "
                        "(while one runs: the one before it)")


@client_errors_to_exit_codes
def run(args: argparse.Namespace) -> int:
    """Run the ``status`` subcommand; returns the exit code."""
    from coordinator.service.client import CoordinatorClient

    if args.last_drain and not args.timeline:
        print("shutdown-coordinator status: --last-drain goes with --timeline FILE.svg",
              file=sys.stderr)
        return exit_codes.USAGE
    if args.timeline and not args.timeline.lower().endswith(".svg"):
        print(f"shutdown-coordinator status: --timeline {args.timeline}: the timeline is "
              "drawn as SVG; name the file FILE.svg (GET /status/timeline serves it as an "
              "HTML page)", file=sys.stderr)
        return exit_codes.USAGE
    with CoordinatorClient(args.url, read_token(args)) as client:
        if args.timeline:
            which = "last" if args.last_drain else "current"
            missing = _no_drain_to_draw(client.status(), which)
            if missing:
                print(f"shutdown-coordinator status: {missing}; nothing written",
                      file=sys.stderr)
                return exit_codes.USAGE
            return _save_timeline(client, args.timeline, which)
        if args.plan:
            _print_plan(client, as_json=args.json)
        else:
            _print_state(client, as_json=args.json, watch=args.watch)
    return exit_codes.OK


def interrupted(args: argparse.Namespace) -> str:
    """What goes on after Ctrl-C: ``status`` only reads, and a running drain goes on."""
    if args.watch:
        return (f"stopped watching; a running drain goes on in the coordinator at {args.url} "
                f"(`shutdown-coordinator drain --abort{same_coordinator(args)}` aborts it "
                "until it terminates processes)")
    if args.timeline:
        return "no timeline written; the coordinator is as it was"
    return "the coordinator is as it was (status only reads)"


def _no_drain_to_draw(document: dict[str, Any], which: str) -> str | None:
    """Why there is no ``which`` drain to draw (``current``: the running or latest one;
    ``last``: the one before), or None when there is one."""
    if which == "last" and not document.get("last_drain"):
        return "--last-drain: no drain has ended since the coordinator started"
    if not document.get("drain") and not document.get("last_drain"):
        return "the coordinator has not drained since it started: no drain to draw"
    return None


def drain_ended(document: dict[str, Any]) -> bool:
    """A watched drain has ended (done, or aborted back to serving): where ``status --watch``
    and ``drain`` stop."""
    return document["phase"] == "done" or (
        document["phase"] == "serving" and document.get("outcome") == "aborted")


def _save_timeline(client: CoordinatorClient, path: str, drain: str) -> int:
    """The coordinator draws it (with the handoffs it remembers); this writes the file."""
    from coordinator.timeline import save

    svg = client.timeline_svg(drain)
    try:
        save(svg, path)
    except OSError as exc:
        print(f"shutdown-coordinator status: cannot write {path}: {exc.strerror or exc}",
              file=sys.stderr)
        return exit_codes.USAGE
    print(f"wrote the {drain} drain's timeline to {path}", file=sys.stderr)
    return exit_codes.OK


def _print_plan(client: CoordinatorClient, *, as_json: bool) -> None:
    from coordinator.service.render import plan_text

    plan = client.plan()
    print(json.dumps(plan, indent=2) if as_json else plan_text(plan))


def _print_state(client: CoordinatorClient, *, as_json: bool, watch: bool) -> None:
    """The ``/status`` document; with ``watch``, again at every change until the drain ends."""
    from coordinator.service.render import status_text

    document = client.status()
    if as_json:  # with --watch, one document a line
        print(json.dumps(document, indent=None if watch else 2), flush=True)
    else:
        print(status_text(document), flush=True)
    while watch and not drain_ended(document) and not reader_gone():
        document = client.status(wait=10.0, since=int(document["generation"]))
        if as_json:
            print(json.dumps(document), flush=True)
        else:
            clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
            print(clear + status_text(document), flush=True)
