"""``shutdown-coordinator serve``: run the coordinator.

Every flag is a field of ``coordinator.settings.Settings`` and also reads
``SHUTDOWN_COORDINATOR_<FIELD>``; a flag not given leaves the field to its variable or its
default. Settings that must not serve are refused before anything listens, in the operator's
words, with the usage exit code.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import exit_codes
from coordinator.settings import ENV_PREFIX
from coordinator.tier_settings import TierSyntaxError, parse_tier

if TYPE_CHECKING:
    from coordinator.kill import TierSpec
    from coordinator.service.posture import Posture
    from coordinator.settings import Settings

# flag → (Settings field, type, help). None defaults mean "not given": env or default apply.
SERVE_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--host", "host", str, "address to bind (default 127.0.0.1)"),
    ("--port", "port", int, "TCP port, 0 for any free one (default 8787)"),
    ("--port-file", "port_file", Path, "write {host, port, url, pid} here once listening"),
    ("--public-host", "public_host", str,
     "also listen on this address (the pod's IP) for /healthz, /readyz and /metrics only"),
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
    ("--token-file", "token_file", Path,
     f"file holding the bearer token (or the token itself in {ENV_PREFIX}TOKEN, which "
     "/proc/PID/environ shows: prefer the file)"),
    ("--state-file", "state_file", Path, "persist the drain here to survive a restart"),
    ("--doorbell", "doorbell", str,
     "named pipe that wakes every worker at once: auto (default), off, or a path"),
    ("--engine-metrics-url", "engine_metrics_url", str,
     "Prometheus endpoint of an adopted engine: its in-flight requests hold the migration"),
    ("--engine", "engine", str,
     "the engine's profile: vllm, sglang, dynamo, trtllm, tgi or generic (default): adoption "
     "patterns, kill tiers and in-flight probe for an engine that does not register"),
    ("--engine-url", "engine_url", str,
     "the engine's own API for --end-streams (default: the profile's port on loopback)"),
    ("--router-worker-url", "router_worker_url", str,
     "how the --router routers know this pod's engine (http://POD_IP:PORT)"),
    ("--router-token-file", "router_token_file", Path,
     "file holding smg's control-plane key (sent as Authorization: Bearer)"),
    ("--confine-to-pid", "confine_to_pid", int,
     "only register or adopt processes descending from this PID"),
    ("--group-leader", "group_leader", str,
     "the group leader's coordinator URL, on a follower pod (default: from LWS_LEADER_ADDRESS)"),
    ("--group-size", "group_size", int,
     "pods in the group, the leader included (default: LWS_GROUP_SIZE)"),
    ("--group-index", "group_index", int,
     "this pod's index in its group, 0 for the leader (default: LWS_WORKER_INDEX)"),
    ("--group-url", "group_url", str, "how the group's other coordinators reach this one"),
    ("--group-leader-timeout", "group_leader_timeout_s", float,
     "seconds a draining follower waits for an unreachable leader before draining alone "
     "(default 10)"),
    ("--group-follower-share", "group_follower_share", float,
     "fraction of the budget the followers' kills keep after the leader's engine stopped "
     "(default 0.25)"),
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
_REPEATED_FLAGS = {
    "adopt_pids": "--adopt-pid", "adopt_patterns": "--adopt-pattern",
    "adopt_tiers": "--adopt-tier", "engine_inflight_metrics": "--engine-inflight-metric",
    "routers": "--router", "router_join": "--no-router-join", "end_streams": "--end-streams",
    "group_engine_first": "--no-group-engine-first",
    "allow_unauthenticated_network": "--allow-unauthenticated-network",
    "allowed_hosts": "--allowed-host"}
"""The flags outside ``SERVE_FLAGS`` that name a setting, by field (for refusal messages)."""


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _tier_arg(text: str) -> TierSpec:
    try:
        return parse_tier(text)
    except TierSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``serve`` subcommand."""
    add_settings_arguments(sub.add_parser("serve", help="run the coordinator"))


def add_settings_arguments(serve: argparse.ArgumentParser) -> None:
    """Every setting as a flag of ``serve`` (``run`` takes the same ones)."""
    for flag, field, kind, text in SERVE_FLAGS:
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
    serve.add_argument("--router", dest="routers", action="append", default=None,
                       metavar="KIND=URL", help="a router in front of this pod's engine, told "
                       "at a drain's start to send it nothing new and on an abort to send it "
                       "requests again; KIND smg, vllm-router or reference (repeatable) "
                       f"[env {_env_name('routers')}]")
    serve.add_argument("--no-router-join", dest="router_join", action="store_const",
                       const=False, default=None,
                       help="do not add the engine to the --router routers once it is healthy "
                       "at start (for routers that discover pods themselves) "
                       f"[env {_env_name('router_join')}]")
    serve.add_argument("--end-streams", dest="end_streams", action="store_const", const=True,
                       default=None,
                       help="a continuing proxy sits in front: once the routers took the pod "
                       "out, end the engine's in-flight requests at once through its own API "
                       "(sglang, vllm profiles) for the proxy to continue elsewhere "
                       f"[env {_env_name('end_streams')}]")
    serve.add_argument("--no-group-engine-first", dest="group_engine_first",
                       action="store_const", const=False, default=None,
                       help="on the group's leader, stop the engine children first like any "
                       "pod, not its main processes first "
                       f"[env {_env_name('group_engine_first')}]")
    serve.add_argument("--allow-unauthenticated-network", dest="allow_unauthenticated_network",
                       action="store_const", const=True, default=None,
                       help="serve a non-loopback --host without a token (refused otherwise: "
                       "anyone reaching the port could drain the pod) "
                       f"[env {_env_name('allow_unauthenticated_network')}]")
    serve.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=None,
                       metavar="NAME",
                       help="a name the Host header may carry besides any IP address, "
                       "localhost and this host's name (repeatable; * for any): others are "
                       f"answered 421 [env {_env_name('allowed_hosts')}]")
    serve.add_argument("--no-status-cache", dest="status_cache", action="store_const",
                       const=False, default=None, help=argparse.SUPPRESS)


def interrupted(args: argparse.Namespace) -> str:
    """Ctrl-C before the server took its signals over (while it started); once it serves,
    the server says it itself (``service/server.py``: the drain goes on to its end first)."""
    return "the coordinator stopped before it served; nothing was drained"


def run(args: argparse.Namespace) -> int:
    """Run the ``serve`` subcommand until the coordinator stops; returns the exit code.

    No garbage collection until the server listens (``server.collect_from_now_on``): the
    imports and the app make objects that live as long as the process, and collecting
    meanwhile only costs CPU. Back on whichever way this returns (a refused start, in a
    process that goes on)."""
    gc.disable()
    try:
        return _run(args)
    finally:
        gc.enable()


def _run(args: argparse.Namespace) -> int:
    # Imported here: FastAPI, uvicorn and psutil would slow every other command's start,
    # among them ``drain`` in the preStop hook.
    from coordinator.service.server import serve

    checked = checked_settings(args, "serve")
    if checked is None:
        return exit_codes.USAGE
    settings, posture = checked
    try:
        return serve(settings, checked=posture)
    except OSError as exc:
        return refused_start(exc, "serve")


def refused_start(exc: OSError, command: str) -> int:
    """Say why the service could not start (on stderr) and return its exit code: the state
    file's own for a state file refused (locked by another coordinator, or unsafe), usage
    for anything else (an address in use, a file that cannot be opened)."""
    from coordinator.drain.state_claim import StateFileLocked, StateFileRefused

    print(f"shutdown-coordinator {command}: {exc}", file=sys.stderr)
    if isinstance(exc, StateFileLocked):
        return exit_codes.STATE_FILE_LOCKED
    if isinstance(exc, StateFileRefused):
        return exit_codes.STATE_FILE_UNSAFE
    return exit_codes.USAGE


def checked_settings(args: argparse.Namespace,
                     command: str) -> tuple[Settings, Posture] | None:
    """The settings the flags (and the environment) give, with their security posture; None,
    after saying why on stderr in the operator's words, when they must not serve."""
    from pydantic import ValidationError

    from coordinator import startup_check
    from coordinator.service import posture
    from coordinator.settings import Settings

    given = {field: getattr(args, field) for _, field, _, _ in SERVE_FLAGS}
    given.update({field: getattr(args, field) for field in _REPEATED_FLAGS})
    given.update(status_cache=args.status_cache)
    flags = {field: flag for flag, field, _, _ in SERVE_FLAGS} | _REPEATED_FLAGS
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
            print(f"shutdown-coordinator {command}: {problem}", file=sys.stderr)
        return None
    return settings, checked
