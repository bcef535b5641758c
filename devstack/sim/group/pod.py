"""One pod of a multi-node engine: ``python -m devstack.sim --nnodes N --node-rank I ...``.

Pod 0 (the leader) is the simulated engine's main process serving HTTP, with its ranks in
place of its schedulers (``leader.py``). Every other pod is a follower: a main process with
no HTTP that starts its ranks and waits for them, as SGLang's ``--node-rank`` ≥ 1 does
(``_launch_subprocesses``: "Non-zero-rank nodes do not run tokenizer processes"):

1. Write the end record; register with the coordinator when ``--coordinator`` is given.
2. Start this pod's ranks (``schedulers`` of them, global ranks ``node_rank * schedulers``
   on) and wait until each reports ready, that is until the whole group is formed.
3. Write the ready file (``url`` is empty: a follower serves no HTTP).
4. Wait for the ranks to exit. On SIGTERM or SIGINT, by default, only note it: like
   SGLang's follower, it waits for rank 0 to finish the group ("waiting for the rank-0
   ShutdownReq broadcast"), and a per-pod stop must end its ranks itself. With
   ``--graceful-main`` it passes SIGTERM on to its ranks, which leave the group, as vLLM's
   ``--headless`` node does (``SystemExit``, then its engine manager stops its engines).
5. When a rank fails (non-zero exit or a signal) SIGKILL the others and exit
   ``EXIT_GROUP_BROKEN`` (SGLang's scheduler crash takes its node down the same way); when
   every rank exited 0, exit 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from devstack.sim.errors import SimStartupError
from devstack.sim.group.rank import register
from devstack.sim.knobs import EngineKnobs
from devstack.sim.linux import open_pidfd, send_signal
from devstack.sim.main_process import common_child_args
from devstack.sim.records import CLEANUP_INTERRUPTED, RecordWriter, write_json_atomically
from devstack.sim.roles import EXIT_OK, EXIT_STARTUP_FAILED, Role
from devstack.sim.signals import SignalLatch, ignore_stop_signals
from devstack.sim.spawn import ChildSpec, StartedChild, spawn_children

EXIT_GROUP_BROKEN = 6
"""A follower pod's main process: one of its ranks failed (so the group is broken)."""
RANK_MODULE = "group.rank"
RANK_STARTUP_SHARE = 0.8
"""A rank gives up forming the group at this share of its pod's startup bound (counted from
when the pod starts its ranks: the clock is the machine's), so that the rank, not its
parent's SIGKILL at the full bound, says which ranks never joined."""


def world_size(knobs: EngineKnobs) -> int:
    return knobs.nnodes * knobs.schedulers


def rank_specs(knobs: EngineKnobs, record_dir: Path) -> list[ChildSpec]:
    """This pod's ranks: ``schedulers`` of them, numbered across the group."""
    group = [
        "--world-size", str(world_size(knobs)),
        "--node-rank", str(knobs.node_rank),
        "--dist-init-addr", knobs.dist_init_addr,
        "--collective-timeout-s", str(knobs.collective_timeout_s),
        "--startup-deadline", str(time.monotonic() + knobs.startup_timeout_s * RANK_STARTUP_SHARE),
    ]  # fmt: skip
    if not knobs.rank0_sigterm_finishes:
        group.append("--leave-on-sigterm")
    if knobs.coordinator:
        group += ["--coordinator", knobs.coordinator,
                  "--coordinator-token-file", knobs.coordinator_token_file]
    first = knobs.node_rank * knobs.schedulers
    common = common_child_args(knobs, record_dir)
    return [ChildSpec(RANK_MODULE, ("--rank", str(rank), *common, *group))
            for rank in range(first, first + knobs.schedulers)]


def run_pod(knobs: EngineKnobs, *, record_dir: Path, ready_file: Path | None) -> int:
    """Run this pod's part of the group; returns the process's exit code."""
    if knobs.node_rank == 0:
        from devstack.sim.group.leader import GroupLeader

        return asyncio.run(GroupLeader(knobs, record_dir=record_dir, ready_file=ready_file).run())
    return FollowerMain(knobs, record_dir, ready_file).run()


class FollowerMain:
    """The main process of a follower pod (see the module's docstring)."""

    def __init__(self, knobs: EngineKnobs, record_dir: Path, ready_file: Path | None) -> None:
        self.knobs = knobs
        self.record_dir = record_dir
        self.ready_file = ready_file
        self.record = RecordWriter(record_dir, Role.MAIN)
        self.ranks: list[StartedChild] = []
        self.exit_codes: dict[int, int] = {}

    def run(self) -> int:
        k = self.knobs
        latch = SignalLatch((signal.SIGTERM, signal.SIGINT))
        self.record.update(knobs=k.to_argv(), node_rank=k.node_rank, world_size=world_size(k))
        client = None
        if k.coordinator:
            client = register(k.coordinator, k.coordinator_token_file, role="worker",
                              name=f"sim-node-{k.node_rank}", record=self.record)
        try:
            self.ranks = spawn_children(rank_specs(k, self.record_dir),
                                        timeout_s=k.startup_timeout_s)
        except SimStartupError as exc:
            self.record.ended(EXIT_STARTUP_FAILED, cleanup=CLEANUP_INTERRUPTED, detail=str(exc))
            return EXIT_STARTUP_FAILED
        self.record.update(children=[r.pid for r in self.ranks])
        self._write_ready_file()
        code = self._wait_for_ranks(latch)
        ignore_stop_signals()
        if client is not None:
            client.close()
        return code

    def processes(self) -> list[dict[str, Any]]:
        me = {"pid": os.getpid(), "role": Role.MAIN.value, "rank": None, "ppid": os.getppid()}
        return [me, *(p for rank in self.ranks for p in rank.processes)]

    def _write_ready_file(self) -> None:
        if self.ready_file is not None:
            write_json_atomically(self.ready_file, {
                "pid": os.getpid(), "port": 0, "url": "", "node_rank": self.knobs.node_rank,
                "processes": self.processes(),
            })

    def _wait_for_ranks(self, latch: SignalLatch) -> int:
        """Steps 4 and 5 of the module's docstring."""
        pidfds = {fd: rank for rank in self.ranks if (fd := open_pidfd(rank.pid)) is not None}
        for rank in self.ranks:
            if rank not in pidfds.values():  # gone before we looked
                self._reaped(rank)
        while len(self.exit_codes) < len(self.ranks):
            if any(code != 0 for code in self.exit_codes.values()):
                return self._group_broken(pidfds)
            for fd in latch.wait(tuple(pidfds)):
                os.close(fd)
                self._reaped(pidfds.pop(fd))
            for signum in latch.take():
                self.record.signalled(signum)
                if not self.knobs.graceful_main:
                    self.record.update(detail="waiting for rank 0 to finish the group")
                    continue
                self.record.update(detail="passed SIGTERM on to its ranks")
                for rank in pidfds.values():
                    send_signal(rank.pid, signal.SIGTERM)
        if any(code != 0 for code in self.exit_codes.values()):
            return self._group_broken(pidfds)
        self.record.ended(EXIT_OK)
        return EXIT_OK

    def _reaped(self, rank: StartedChild) -> None:
        self.exit_codes[rank.pid] = rank.popen.wait()
        self.record.update(children_exit_codes={str(p): c for p, c in self.exit_codes.items()})

    def _group_broken(self, pidfds: dict[int, StartedChild]) -> int:
        failed = {pid: code for pid, code in self.exit_codes.items() if code != 0}
        for fd, rank in pidfds.items():
            send_signal(rank.pid, signal.SIGKILL)
            os.close(fd)
            self._reaped(rank)
        self.record.ended(EXIT_GROUP_BROKEN, cleanup=CLEANUP_INTERRUPTED,
                          detail=f"ranks failed (pid: exit code): {failed}")
        return EXIT_GROUP_BROKEN
