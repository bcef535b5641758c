"""``shutdown-coordinator``: ``serve``, ``drain``, ``status`` and ``kill``.

Every ``serve`` flag also reads ``SHUTDOWN_COORDINATOR_<NAME>`` (see ``coordinator.settings``);
the client commands read ``SHUTDOWN_COORDINATOR_URL`` and ``SHUTDOWN_COORDINATOR_TOKEN_FILE``
(or ``SHUTDOWN_COORDINATOR_TOKEN``). Exit codes are in ``coordinator.exit_codes``.

The demo is a command of its own, ``shutdown-coordinator-demo`` (``devstack.demo``), which no
module of the product imports; ``shutdown-coordinator demo`` only says so (``DEMO_MOVED``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import __version__, exit_codes, kill_command
from coordinator.kill.policy import TierSpec
from coordinator.settings import DEFAULT_URL, ENV_PREFIX
from coordinator.tier_settings import TierSyntaxError, parse_tier

if TYPE_CHECKING:
    from coordinator.service.client import CoordinatorClient

RECONNECT_S = 15.0
"""How long ``drain`` keeps retrying a coordinator that went away (it may be restarting)."""
REDRAW_S = 1.0
"""On a terminal, ``drain`` redraws its progress line at least this often (seconds), so the
budget left and the countdown to a waited-on process's SIGKILL keep moving between changes;
in a log it writes one line per change only."""

# flag → (Settings field, type, help). None defaults mean "not given": env or default apply.
_SERVE_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--host", "host", str, "address to bind (default 127.0.0.1)"),
    ("--port", "port", int, "TCP port, 0 for any free one (default 8787)"),
    ("--port-file", "port_file", Path, "write {host, port, url, pid} here once listening"),
    ("--grace-period", "grace_period_s", float,
     "the pod's termination grace period in seconds (default 30)"),
    ("--safety-margin", "safety_margin_s", float,
     "seconds of the grace period the drain leaves unused (default 5)"),
    ("--min-drain", "min_drain_s", float, "seconds to stay in draining at least (default 0)"),
    ("--tier-timeout", "tier_timeout_s", float,
     "seconds per kill tier before SIGKILL (default 10)"),
    ("--confirm-timeout", "confirm_s", float,
     "seconds to wait for a SIGKILLed process to disappear (default 2)"),
    ("--prekill-timeout", "prekill_timeout_s", float,
     "seconds to wait for workers' pre-kill hooks (default 2)"),
    ("--token-file", "token_file", Path, "file holding the bearer token"),
    ("--state-file", "state_file", Path, "persist the drain here to survive a restart"),
    ("--doorbell", "doorbell", str,
     "named pipe that wakes every worker at once: auto (default), off, or a path"),
    ("--engine-metrics-url", "engine_metrics_url", str,
     "Prometheus endpoint of an adopted engine: its in-flight requests hold the migration"),
    ("--engine", "engine", str,
     "the engine's profile: vllm, sglang, dynamo, trtllm, tgi or generic (default): adoption "
     "patterns, kill tiers and in-flight probe for an engine that does not register"),
    ("--confine-to-pid", "confine_to_pid", int,
     "only register or adopt processes descending from this PID"),
    ("--long-poll-cap", "long_poll_cap_s", float, "cap on /status?wait=S (default 30)"),
    ("--max-body-bytes", "max_body_bytes", int,
     "largest request body, 413 above it (default 8 MiB)"),
    ("--read-timeout", "read_timeout_s", float,
     "seconds a request's head, and then its body, may take to arrive (default 10)"),
    ("--max-connections", "max_connections", int,
     "open connections at most, 503 past it (default 8192)"),
    ("--max-workers", "max_workers", int,
     "registered workers at most, 429 past it (default 1024)"),
    ("--max-streams-per-worker", "max_streams_per_worker", int,
     "event streams one worker may hold open, 429 past it (default 4)"),
    ("--max-handoffs", "max_handoffs", int,
     "handed-back requests awaiting acknowledgement at most, 429 past it (default 10000)"),
    ("--max-early-acks", "max_early_acks", int,
     "acknowledgements of handoffs not yet reported at most, 429 past it (default 10000)"),
    ("--max-long-polls", "max_long_polls", int,
     "GET /status?wait callers waiting at once, 429 past it (default 1024)"),
    ("--expire-after", "expire_after_s", float,
     "seconds pending handoffs, early acks and exited workers are kept while no drain "
     "runs (default 60)"),
    ("--scan-interval", "process_scan_interval_s", float,
     "seconds between process tree scans for /status (default 5)"),
    ("--log-level", "log_level", str, "critical, error, warning, info (default), debug"),
]


_METAVARS: dict[Any, str] = {float: "S", int: "N", Path: "FILE"}

DEMO_MOVED = ("shutdown-coordinator: the demo is a command of its own now: "
              "shutdown-coordinator-demo (installed with this package)")
"""What ``shutdown-coordinator demo``, the README's first command until the demo left the
product, prints before it exits ``USAGE``: a pointer instead of argparse's bare "invalid
choice", and a failure, so a script that ran the demo does not pass without running it."""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 (excluded) and 86400 s")
    return value


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _tier_arg(text: str) -> TierSpec:
    try:
        return parse_tier(text)
    except TierSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="shutdown-coordinator",
        description="Drain LLM inference pods without losing requests or leaking processes.",
        epilog=exit_codes.describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the coordinator")
    for flag, field, kind, text in _SERVE_FLAGS:
        serve.add_argument(flag, dest=field, type=kind, default=None, metavar=_METAVARS.get(
                               kind, flag.removeprefix("--").upper()),
                           help=f"{text} [env {_env_name(field)}]")
    serve.add_argument("--adopt-pid", dest="adopt_pids", type=int, action="append",
                       default=None, metavar="PID",
                       help=f"adopt this process tree (repeatable) [env {_env_name('adopt_pids')}]")
    serve.add_argument("--adopt-pattern", dest="adopt_patterns", action="append", default=None,
                       metavar="REGEX", help="adopt trees whose command line matches "
                       f"(repeatable) [env {_env_name('adopt_patterns')}]")
    serve.add_argument("--adopt-tier", dest="adopt_tiers", type=_tier_arg, action="append",
                       default=None, metavar="NAME=REGEX[:TIMEOUT_S[:SIGNAL]][:root]",
                       help="kill tier for adopted trees, in order (repeatable); 'root' lets "
                       f"it hold the adopted root itself [env {_env_name('adopt_tiers')}]")
    serve.add_argument("--engine-inflight-metric", dest="engine_inflight_metrics",
                       action="append", default=None, metavar="NAME",
                       help="a gauge of the engine's in-flight requests (repeatable; default: "
                       "vLLM's and SGLang's running and waiting requests) "
                       f"[env {_env_name('engine_inflight_metrics')}]")
    serve.add_argument("--allow-unauthenticated-network", dest="allow_unauthenticated_network",
                       action="store_const", const=True, default=None,
                       help="serve a non-loopback --host without a token (refused otherwise: "
                       "anyone reaching the port could drain the pod) "
                       f"[env {_env_name('allow_unauthenticated_network')}]")
    serve.add_argument("--no-status-cache", dest="status_cache", action="store_const",
                       const=False, default=None, help=argparse.SUPPRESS)

    def client_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", default=os.environ.get(ENV_PREFIX + "URL", DEFAULT_URL),
                       help=f"coordinator URL (default {DEFAULT_URL}) [env {ENV_PREFIX}URL]")
        p.add_argument("--token-file", type=Path,
                       default=os.environ.get(ENV_PREFIX + "TOKEN_FILE") or None,
                       help=f"bearer token file [env {ENV_PREFIX}TOKEN_FILE, or "
                       f"{ENV_PREFIX}TOKEN]")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")

    drain = sub.add_parser("drain", help="drain a running coordinator and print the summary")
    client_flags(drain)
    drain.add_argument("--reason", default="operator", help="why (shown in /status)")
    drain.add_argument("--deadline", type=_positive_seconds, default=None, metavar="S",
                       help="a shorter budget for this drain, in seconds")
    drain.add_argument("--quiet", action="store_true", help="no progress lines")
    drain.add_argument("--force", action="store_true",
                       help="skip migration and SIGKILL every process at once; escalates a "
                       "drain that is already running")

    status = sub.add_parser("status", help="print the coordinator's state")
    client_flags(status)
    status.add_argument("--plan", action="store_true",
                        help="print the kill as it would run now: tiers in order, each with "
                        "its signal, timeout and processes")
    status.add_argument("--watch", action="store_true",
                        help="print the state again at every change (a drain as it runs) "
                        "until interrupted, or until a drain is done")

    kill_command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        print(DEMO_MOVED, file=sys.stderr)
        return exit_codes.USAGE
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:
        return exit_codes.USAGE if exc.code not in (0, None) else exit_codes.OK
    try:
        return _dispatch(args, parser)
    except BrokenPipeError:
        # The reader went away (``status | head -1``): nothing more to say, and Python must
        # not complain when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exit_codes.OK


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "serve":
        return _serve(args, parser)
    if args.command == "drain":
        return _drain(args)
    if args.command == "kill":
        return kill_command.run(args)
    return _status(args)


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from pydantic import ValidationError

    from coordinator import startup_check
    from coordinator.service import posture
    from coordinator.service.server import serve
    from coordinator.settings import Settings

    given = {field: getattr(args, field) for _, field, _, _ in _SERVE_FLAGS}
    given.update(engine_inflight_metrics=args.engine_inflight_metrics,
                 adopt_pids=args.adopt_pids, adopt_patterns=args.adopt_patterns,
                 adopt_tiers=args.adopt_tiers, status_cache=args.status_cache,
                 allow_unauthenticated_network=args.allow_unauthenticated_network)
    flags = {field: flag for flag, field, _, _ in _SERVE_FLAGS} | {
        "adopt_pids": "--adopt-pid", "adopt_patterns": "--adopt-pattern",
        "adopt_tiers": "--adopt-tier", "engine_inflight_metrics": "--engine-inflight-metric",
        "allow_unauthenticated_network": "--allow-unauthenticated-network"}
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
        problems = startup_check.refusals(settings)
        checked = posture.check(settings) if not problems else None
    except ValidationError as exc:
        problems = startup_check.explain(exc, flags)
    except (OSError, ValueError) as exc:
        problems = [str(exc)]
    if problems or checked is None:
        for problem in problems:
            print(f"shutdown-coordinator serve: {problem}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        return serve(settings, checked=checked)
    except OSError as exc:
        print(f"shutdown-coordinator serve: {exc}", file=sys.stderr)
        return exit_codes.USAGE


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        return Path(args.token_file).read_text(encoding="utf-8").strip() or None
    return os.environ.get(ENV_PREFIX + "TOKEN") or None


def _client_errors(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    def wrapper(args: argparse.Namespace) -> int:
        from coordinator.service.client import AuthError, ClientError, RefusedError

        try:
            return func(args)
        except BrokenPipeError:
            raise  # our reader went away: main() ends quietly
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.USAGE
        except AuthError as exc:
            print(f"error: the coordinator refused the token: {exc}", file=sys.stderr)
            return exit_codes.AUTH_FAILED
        except RefusedError as exc:
            print(f"error: the coordinator refused: {exc}", file=sys.stderr)
            return exit_codes.REFUSED
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.UNREACHABLE

    return wrapper


@_client_errors
def _status(args: argparse.Namespace) -> int:
    from coordinator.service.client import CoordinatorClient
    from coordinator.service.render import plan_text, status_text

    with CoordinatorClient(args.url, _token(args)) as client:
        if args.plan:
            plan = client.plan()
            print(json.dumps(plan, indent=2) if args.json else plan_text(plan))
            return exit_codes.OK
        document = client.status()
        if args.json:  # with --watch, one document a line
            print(json.dumps(document, indent=None if args.watch else 2), flush=True)
        else:
            print(status_text(document), flush=True)
        while args.watch and not _finished(document):
            document = client.status(wait=10.0, since=int(document["generation"]))
            if args.json:
                print(json.dumps(document), flush=True)
            else:
                clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
                print(clear + status_text(document), flush=True)
    return exit_codes.OK


def _finished(document: dict[str, Any]) -> bool:
    """A watched drain has ended (done, or aborted back to serving)."""
    return document["phase"] == "done" or (
        document["phase"] == "serving" and document.get("outcome") == "aborted")


def _start_drain(client: CoordinatorClient, args: argparse.Namespace) -> dict[str, Any]:
    return client.start_drain(args.reason, args.deadline, force=args.force)


@_client_errors
def _drain(args: argparse.Namespace) -> int:
    from coordinator.service.client import ClientError, CoordinatorClient
    from coordinator.service.render import drain_verdict, progress_line, status_text

    with CoordinatorClient(args.url, _token(args)) as client:
        started = _start_drain(client, args)
        since = int(started["generation"]) - 1
        tty = sys.stderr.isatty()
        redraw = tty and not args.quiet and not args.json
        columns = shutil.get_terminal_size().columns - 1
        document: dict[str, Any] | None = None
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
            if redraw:
                # On a terminal one line is rewritten in place, also when nothing changed (its
                # countdowns move); in a log, one line a change.
                print("\r\x1b[K" + progress_line(document, width=columns), end="",
                      file=sys.stderr, flush=True)
            elif generation > since and not args.quiet and not args.json:
                print(progress_line(document), file=sys.stderr, flush=True)
            since = max(since, generation)
            if _finished(document):
                break
        if redraw:
            print(file=sys.stderr)
    outcome, causes, _ = drain_verdict(document)
    outcome = outcome or "survived"
    print(json.dumps(document, indent=2) if args.json else status_text(document))
    if outcome == "nothing_to_drain":
        # Always on stderr, even with --json or --quiet: a drain that ended nothing usually
        # means a deployment mistake (no worker registered, an adoption pattern that misses).
        why = " ".join(causes) or "no process was registered or adopted."
        print(f"warning: nothing to drain: {why}", file=sys.stderr, flush=True)
    return exit_codes.OUTCOME_CODES.get(outcome, exit_codes.SURVIVED)
