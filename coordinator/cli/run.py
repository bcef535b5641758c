"""``shutdown-coordinator run [serve's flags] -- COMMAND…``: the coordinator as the engine's init.

The engine runs as this process's child, the coordinator's API beside it (what ``serve``
serves, with every ``serve`` flag and variable), and the runtime's stop signal runs the drain
a preStop hook would. Everything an init does is done too: orphans reaped, other signals
passed on to the engine's main process, its exit status returned as this process's own
(``coordinator.init``). Settings that must not serve are refused before the command starts,
with the usage exit code; a command that cannot start exits 127 (not found) or 126.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from coordinator import exit_codes
from coordinator.cli.serve import add_settings_arguments, checked_settings, refused_start

STOP_SIGNAL_ENV = "SHUTDOWN_COORDINATOR_STOP_SIGNAL"
DEFAULT_STOP_SIGNAL = "SIGTERM"
"""What Kubernetes, podman, Docker and systemd send first; an image whose ``STOPSIGNAL`` is
another names it here too."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``run`` subcommand."""
    run_parser = sub.add_parser(
        "run", help="run an engine as this process's child, its init and its coordinator",
        usage="%(prog)s [serve's flags] [--stop-signal SIG] -- COMMAND [ARG...]",
        description="Start COMMAND as a child and serve the coordinator's API beside it. "
        "The stop signal (SIGTERM) runs the drain; a second one escalates it; other signals "
        "go to COMMAND's process; orphans are reaped. Exits with COMMAND's own status "
        "(128+N when a signal N ended it).")
    run_parser.add_argument(
        "--stop-signal", default=None, metavar="SIG",
        help="the signal that starts the drain (default SIGTERM: the runtime's) "
        f"[env {STOP_SIGNAL_ENV}]")
    add_settings_arguments(run_parser)
    run_parser.add_argument("engine_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                            help="the engine's command line, after --")


def interrupted(args: argparse.Namespace) -> str:
    """Ctrl-C before the engine started (while the settings were read); from the engine's
    start on, SIGINT is caught and passed on to the engine's main process."""
    return "the engine was not started; nothing runs"


def run(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand until the engine has ended; returns its exit status."""
    from coordinator.init.engine_child import SpawnError
    from coordinator.init.lifecycle import parse_signal
    from coordinator.init.server import run_engine

    command = list(args.engine_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("shutdown-coordinator run: no command to run (run [flags] -- COMMAND ...)",
              file=sys.stderr)
        return exit_codes.USAGE
    try:
        stop_signal = parse_signal(args.stop_signal or os.environ.get(STOP_SIGNAL_ENV)
                                   or DEFAULT_STOP_SIGNAL)
    except ValueError as exc:
        print(f"shutdown-coordinator run: --stop-signal: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    gc.disable()  # as serve: on again once the server listens
    try:
        checked = checked_settings(args, "run")
        if checked is None:
            return exit_codes.USAGE
        settings, posture = checked
        try:
            return run_engine(settings, command, stop_signal=stop_signal, checked=posture)
        except SpawnError as exc:
            print(f"shutdown-coordinator run: {exc}", file=sys.stderr)
            return exc.exit_code
        except OSError as exc:
            return refused_start(exc, "run")
    finally:
        gc.enable()
