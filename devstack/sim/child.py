"""What every child of the simulated engine does, from start to exit.

1. Arm ``PR_SET_PDEATHSIG(SIGKILL)``, then check ``getppid()``: if the parent is already
   gone the death signal will never come, so exit at once (as SGLang's children would die).
2. Install the recording SIGTERM handler; ignore SIGINT (the main process decides what a
   Ctrl-C means). Write the end record (``cleanup: "not started"``).
3. Start processes of its own (the DP controller's schedulers); with ``--daemonize`` start
   a daemon (double fork and ``setsid``); report ready, listing them.
4. Serve until a SIGTERM that is honoured (with ``--ignore-sigterm`` the signal is only
   noted in the record).
5. Cleanup: record ``started``; start a helper with ``--fork-on-shutdown``; role-specific
   shutdown (the DP controller stops its schedulers); ``--teardown-s`` seconds of teardown
   (RDMA deregistration, say); wait for the helper; record ``finished``; exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from devstack.sim.daemonize import start_daemon
from devstack.sim.linux import set_parent_death_signal
from devstack.sim.records import RecordWriter
from devstack.sim.roles import EXIT_OK, EXIT_PARENT_GONE, Role, knob_matches
from devstack.sim.signals import SignalLatch, ignore_stop_signals
from devstack.sim.spawn import ChildSpec, StartedChild, report_ready, spawn_children

HELPER_STARTUP_TIMEOUT_S = 30.0


def child_arg_parser(role: Role) -> argparse.ArgumentParser:
    """Arguments every child takes; the main process passes them through unchanged."""
    parser = argparse.ArgumentParser(prog=f"devstack.sim.{role.value}")
    parser.add_argument("--record-dir", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--teardown-s", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="append", default=[], metavar="ROLE[:RANK]")
    parser.add_argument("--fork-on-shutdown", action="append", default=[], metavar="ROLE[:RANK]")
    parser.add_argument("--daemonize", action="append", default=[], metavar="ROLE[:RANK]")
    parser.add_argument("--child-timeout-s", type=float, default=10.0)
    return parser


def child_args(record_dir: str | Path, teardown_s: float, child_timeout_s: float,
               ignore_sigterm: Iterable[str], fork_on_shutdown: Iterable[str],
               daemonize: Iterable[str]) -> list[str]:
    """The arguments every child takes besides its own (``child_arg_parser``)."""
    out = ["--record-dir", str(record_dir), "--teardown-s", str(teardown_s),
           "--child-timeout-s", str(child_timeout_s)]
    for flag, specs in (("--ignore-sigterm", ignore_sigterm),
                        ("--fork-on-shutdown", fork_on_shutdown), ("--daemonize", daemonize)):
        for spec in specs:
            out += [flag, spec]
    return out


def forwarded_args(args: argparse.Namespace) -> list[str]:
    """The knobs a child passes on to processes it starts itself."""
    return child_args(args.record_dir, args.teardown_s, args.child_timeout_s,
                      args.ignore_sigterm, args.fork_on_shutdown, args.daemonize)


class ChildProcess:
    """The lifecycle of one child; subclasses add their own processes and shutdown steps."""

    role: Role = Role.SCHEDULER
    arm_pdeathsig = True
    expects_parent = True
    """Exit at once when the parent that started it is already gone (a daemon has none)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank: int | None = args.rank
        self.ignores_sigterm = knob_matches(args.ignore_sigterm, self.role, self.rank)
        self.forks_on_shutdown = knob_matches(args.fork_on_shutdown, self.role, self.rank)
        self.daemonizes = knob_matches(args.daemonize, self.role, self.rank)
        self.latch: SignalLatch
        self.record: RecordWriter

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Arguments of this role beyond the common ones."""

    def main(self) -> int:
        if self.arm_pdeathsig:
            set_parent_death_signal(signal.SIGKILL)
        if self.expects_parent and os.getppid() != self.args.parent_pid:
            return EXIT_PARENT_GONE
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.latch = SignalLatch((signal.SIGTERM,))
        self.record = RecordWriter(self.args.record_dir, self.role, rank=self.rank)
        self.record.update(
            pdeathsig="SIGKILL" if self.arm_pdeathsig else None,
            ignores_sigterm=self.ignores_sigterm,
        )
        own = self.start_own_processes()
        if self.daemonizes:
            daemon = start_daemon(self.args.record_dir, timeout_s=HELPER_STARTUP_TIMEOUT_S)
            self.record.update(daemons=[daemon["pid"]])
            own.append(daemon)
        report_ready(self.args.ready_fd, [self.describe(), *own])
        self.serve()
        return self.clean_up()

    def describe(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "role": self.role.value,
            "rank": self.rank,
            "ppid": os.getppid(),
        }

    def start_own_processes(self) -> list[dict[str, Any]]:
        """Start processes of this child's own; returns what they reported."""
        return []

    def watched_fds(self) -> dict[int, Callable[[], None]]:
        """File descriptors to react to while serving (e.g. pidfds of own children)."""
        return {}

    def serving(self) -> bool:
        """Whether to go on serving; a subclass ends it from a watched fd's callback (a rank
        told to finish by rank 0)."""
        return True

    def serve(self) -> None:
        """Block until a SIGTERM this process honours, or ``serving()`` turns False."""
        while self.serving():
            watched = self.watched_fds()
            for fd in self.latch.wait(tuple(watched)):
                watched[fd]()
            if self.honour_signals():
                return

    def honour_signals(self) -> bool:
        """Record the signals received since the last call; True at a SIGTERM honoured."""
        for signum in self.latch.take():
            self.record.signalled(signum)
            if signum == signal.SIGTERM and not self.ignores_sigterm:
                return True
            self.record.update(detail=f"ignored {signal.Signals(signum).name}")
        return False

    def clean_up(self) -> int:
        self.record.cleanup_started()
        helper = self.start_helper() if self.forks_on_shutdown else None
        self.shut_down_own_processes()
        if self.args.teardown_s > 0:
            time.sleep(self.args.teardown_s)
        if helper is not None:
            helper.popen.wait()
        for signum in self.latch.take():
            self.record.signalled(signum)
        self.record.ended(EXIT_OK)
        ignore_stop_signals()
        return EXIT_OK

    def shut_down_own_processes(self) -> None:
        """Role-specific shutdown before the teardown (the DP controller's propagation)."""

    def start_helper(self) -> StartedChild:
        """Start a helper process mid-shutdown: a PID that appears while the tree is killed.

        The helper does not arm PDEATHSIG and runs until it gets SIGTERM; this process waits
        for it after its own teardown, so it stays in this process's tree until then.
        """
        args = ["--record-dir", self.args.record_dir]
        for spec in self.args.ignore_sigterm:
            args += ["--ignore-sigterm", spec]
        (helper,) = spawn_children(
            [ChildSpec("helper", tuple(args))], timeout_s=HELPER_STARTUP_TIMEOUT_S
        )
        self.record.update(children=[*self.record.data["children"], helper.pid])
        return helper


def run_child(cls: type[ChildProcess]) -> None:
    """Entry point of ``python -m devstack.sim.<role>``."""
    parser = child_arg_parser(cls.role)
    cls.add_arguments(parser)
    sys.exit(cls(parser.parse_args()).main())
