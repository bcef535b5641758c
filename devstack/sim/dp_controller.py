"""``python -m devstack.sim.dp_controller --schedulers N``: the data-parallel controller.

Its schedulers are its own children and arm PDEATHSIG against it, so if it dies first they
are SIGKILLed wherever they are in their cleanup. On SIGTERM it therefore (as the upstream
fix does) sends SIGTERM to its schedulers, waits for them up to ``--child-timeout-s``,
SIGKILLs stragglers, and only then runs its own teardown and exits 0. ``--no-propagate``
restores the old behaviour — exit after its own teardown, schedulers never told — to show
the failure mode.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from typing import Any

from devstack.sim.child import ChildProcess, forwarded_args, run_child
from devstack.sim.linux import open_pidfd, send_signal, wait_for_exits
from devstack.sim.roles import Role
from devstack.sim.spawn import ChildSpec, StartedChild, spawn_children

SCHEDULER_STARTUP_TIMEOUT_S = 60.0


class DataParallelController(ChildProcess):
    role = Role.DP_CONTROLLER

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.schedulers: list[StartedChild] = []
        self._pidfds: dict[int, StartedChild] = {}
        self._exit_codes: dict[int, int | None] = {}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--schedulers", type=int, default=2)
        parser.add_argument(
            "--no-propagate",
            action="store_true",
            help="on SIGTERM, exit without stopping the schedulers (the failure mode)",
        )

    def start_own_processes(self) -> list[dict[str, Any]]:
        specs = [
            ChildSpec("scheduler", ("--rank", str(rank), *forwarded_args(self.args)))
            for rank in range(self.args.schedulers)
        ]
        self.schedulers = spawn_children(specs, timeout_s=SCHEDULER_STARTUP_TIMEOUT_S)
        for child in self.schedulers:
            fd = open_pidfd(child.pid)
            if fd is not None:
                self._pidfds[fd] = child
        self.record.update(
            children=[c.pid for c in self.schedulers], propagates_sigterm=not self.args.no_propagate
        )
        return [p for child in self.schedulers for p in child.processes]

    def watched_fds(self) -> dict[int, Callable[[], None]]:
        return {fd: self._make_reaper(fd) for fd in self._pidfds}

    def _make_reaper(self, fd: int) -> Callable[[], None]:
        def on_exit() -> None:
            child = self._pidfds.pop(fd)
            os.close(fd)
            self._exit_codes[child.pid] = child.popen.wait()
            self._note_exits()

        return on_exit

    def _note_exits(self) -> None:
        self.record.update(
            children_exit_codes={str(pid): code for pid, code in self._exit_codes.items()}
        )

    def shut_down_own_processes(self) -> None:
        live = [c for c in self.schedulers if c.pid not in self._exit_codes]
        if self.args.no_propagate:
            self.record.update(detail="exiting without stopping the schedulers")
            return
        # 1. Graceful signal to every scheduler still running.
        for child in live:
            send_signal(child.pid, signal.SIGTERM)
        # 2. Wait for them on pidfds, bounded.
        stragglers = wait_for_exits([c.pid for c in live], self.args.child_timeout_s)
        # 3. SIGKILL only the stragglers, then collect every exit status.
        for pid in stragglers:
            send_signal(pid, signal.SIGKILL)
        for child in live:
            self._exit_codes[child.pid] = child.popen.wait()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()
        self._note_exits()
        if stragglers:
            self.record.update(detail=f"SIGKILLed schedulers {sorted(stragglers)}")


if __name__ == "__main__":
    run_child(DataParallelController)
