"""The command line as a whole: the parser assembled from each command's, and ``main``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from coordinator import __version__, exit_codes
from coordinator.cli import drain, ending, kill, run, serve, status

DEMO_MOVED = ("shutdown-coordinator: the demo is a command of its own now: "
              "shutdown-coordinator-demo (installed with this package)")
"""What ``shutdown-coordinator demo``, the README's first command until the demo left the
product, prints before it exits ``USAGE``: a pointer instead of argparse's bare "invalid
choice", and a failure, so a script that ran the demo does not pass without running it."""


class Command(Protocol):
    """A subcommand: a module of ``coordinator.cli`` with these two functions."""

    def add_parser(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Register the subcommand, its flags and their help."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the subcommand with the parsed ``args``; returns the exit code."""

    def interrupted(self, args: argparse.Namespace) -> str:
        """What goes on when Ctrl-C stopped ``run``, and how to stop or abort it: one line
        (``ending.interrupted``)."""


COMMANDS: dict[str, Command] = {"serve": serve, "run": run, "drain": drain, "status": status,
                                "kill": kill}
"""Each subcommand's module, in the order ``--help`` lists them."""
ENDED_AT_THE_SIGNAL = ("drain", "status")
"""The commands that wait on the coordinator over HTTP: Ctrl-C ends them at the signal
(``ending.interrupt_ends_at_once``)."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="shutdown-coordinator", allow_abbrev=False,
        description="Drain LLM inference pods without losing requests or leaking processes.",
        epilog=exit_codes.describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(sub)
    for each in sub.choices.values():
        # `serve --grace 20` must not pass for --grace-period: a flag is written in full, so
        # a flag added later cannot change what an abbreviation in a script means.
        each.allow_abbrev = False
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    # Cut short, every command ends the same way (``ending``): Ctrl-C says what goes on and
    # exits 130; a reader that goes away (``| head``) keeps the outcome's exit code.
    with ending.tolerant_streams():
        args_list = list(sys.argv[1:] if argv is None else argv)
        if args_list[:1] == ["demo"]:
            print(DEMO_MOVED, file=sys.stderr)
            return exit_codes.USAGE
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:
            return exit_codes.USAGE if exc.code not in (0, None) else exit_codes.OK
        command = COMMANDS[args.command]
        if args.command in ENDED_AT_THE_SIGNAL:
            ending.interrupt_ends_at_once(lambda: command.interrupted(args))
        try:
            return command.run(args)
        except KeyboardInterrupt:
            return ending.interrupted(command.interrupted(args))
