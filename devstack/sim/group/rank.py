"""``python -m devstack.sim.group.rank --rank R --world-size W ...``: one rank of a
multi-node engine (a tensor-parallel scheduler whose peers are in other pods).

Like every child of the simulated engine it arms PDEATHSIG, records itself, and honours
SIGTERM with its cleanup (``devstack.sim.child``); on top of that:

1. Before it reports ready it joins the group: rank 0 listens on ``--dist-init-addr`` and
   waits until every rank joined; any other rank connects to it (``collective.py``). So a
   pod is ready only once the whole group is formed, as an engine whose NCCL init is a
   collective.
2. With ``--coordinator URL`` it registers with that coordinator through ``worker_client``
   (role ``rank``, name ``rank-R``), so a group drain can find every rank; its record notes
   when the drain notice came (``drain_notice_at``).
3. While serving it takes part in every step rank 0 issues; a step that cannot complete
   makes it hang, then abort (``collective timed out``).
4. It ends when the group finishes (rank 0 says so: ``cause: "finished"``), or on its own
   SIGTERM. Rank 0's SIGTERM finishes the group first (unless ``--leave-on-sigterm``); any
   other rank's just leaves it (``cause: "left on SIGTERM"``), which breaks the group if
   rank 0 issues another step.

Its record adds ``world_size``, ``node_rank``, ``steps`` (completed), ``cause``, ``hung``
(``{"step", "waiting_for", "why", "since"}`` once a step could not complete) and, for rank 0,
``peers_lost`` and ``finish`` (each rank's answer).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from devstack.sim.child import ChildProcess, run_child
from devstack.sim.errors import SimStartupError
from devstack.sim.group.collective import Member, Place, Root
from devstack.sim.group.protocol import listen
from devstack.sim.records import CLEANUP_INTERRUPTED, RecordWriter
from devstack.sim.roles import EXIT_STARTUP_FAILED, Role
from devstack.sim.signals import ignore_stop_signals

if TYPE_CHECKING:
    from worker_client import WorkerClient

RANK_ROLE = "rank"
"""The role a rank registers with at its coordinator."""


class Rank(ChildProcess):
    role = Role.SCHEDULER

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.collective: Root | Member | None = None
        self.client: WorkerClient | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--world-size", type=int, required=True)
        parser.add_argument("--node-rank", type=int, required=True)
        parser.add_argument("--dist-init-addr", required=True, metavar="HOST:PORT")
        parser.add_argument("--collective-timeout-s", type=float, default=30.0)
        parser.add_argument("--startup-deadline", type=float, required=True,
                            help="time.monotonic() by which the group must be formed")
        parser.add_argument("--leave-on-sigterm", action="store_true",
                            help="rank 0 too leaves on SIGTERM instead of finishing the group")
        parser.add_argument("--coordinator", default="")
        parser.add_argument("--coordinator-token-file", default="")

    def start_own_processes(self) -> list[dict[str, Any]]:
        """Join the group (rank 0: form it), then register with the coordinator, if any."""
        args = self.args
        self.record.update(node_rank=args.node_rank, world_size=args.world_size, steps=0,
                           cause=None, hung=None)
        place = Place(self.rank or 0, args.world_size, args.collective_timeout_s)
        deadline = args.startup_deadline
        try:
            if place.rank == 0:
                root = Root(place, self.record, self.latch, listen(args.dist_init_addr))
                root.form(deadline)
                self.collective = root
            else:
                member = Member(place, self.record, self.latch)
                member.join(args.dist_init_addr, args.node_rank, deadline)
                self.collective = member
        except SimStartupError as exc:
            self.record.ended(EXIT_STARTUP_FAILED, cleanup=CLEANUP_INTERRUPTED, detail=str(exc))
            sys.exit(EXIT_STARTUP_FAILED)
        if args.coordinator:
            self.client = register(args.coordinator, args.coordinator_token_file,
                                   role=RANK_ROLE, name=f"rank-{place.rank}", record=self.record)
        return []

    def watched_fds(self) -> dict[int, Any]:
        assert self.collective is not None
        return self.collective.fds()

    def serving(self) -> bool:
        return self.collective is None or not self.collective.finished

    def shut_down_own_processes(self) -> None:
        # Rank 0 on SIGTERM finishes the group before its own teardown (unless told to
        # leave like the others); any other rank on SIGTERM just leaves (what the group then
        # does is the group's problem).
        collective = self.collective
        if collective is None or collective.finished:
            return
        if isinstance(collective, Root) and not self.args.leave_on_sigterm:
            collective.finish()
        else:
            collective.leave()

    def clean_up(self) -> int:
        code = super().clean_up()
        ignore_stop_signals()
        if self.client is not None:
            self.client.close()
        return code


def register(url: str, token_file: str, *, role: str, name: str,
             record: RecordWriter) -> WorkerClient:
    """Register the calling process with the coordinator at ``url`` (in the background,
    retrying), reading its drain notice in a thread: the process has no asyncio loop."""
    # Imported here: a rank without --coordinator does not need worker_client.
    from devstack.sim.coordination import read_token
    from worker_client import WorkerClient

    client = WorkerClient(url, token=read_token(token_file), role=role, name=name,
                          event_reader="thread")
    client.on_drain(lambda: record.update(drain_notice_at=time.time()))
    return client.start()


if __name__ == "__main__":
    run_child(Rank)
