"""The collective inside a rank process: rank 0's side (``Root``) and every other rank's
(``Member``), synchronous as a scheduler's step loop is. The rank's loop calls the callbacks
of ``fds()`` when a socket turns readable.

What a rank does when the collective breaks is what NCCL does: nothing at first. A step that
cannot complete (a rank gone, or silent) hangs every rank in it until ``timeout_s``; then the
rank aborts (SIGABRT, as torch's watchdog does with ``std::abort``), its record saying
``collective timed out``, the step, and whom it waited for. A rank whose rank 0 is gone hangs
and aborts the same way even between steps: the rendezvous store it keeps polling lived in
rank 0 (torch's TCPStore), so its watchdog finds the group broken.
"""

from __future__ import annotations

import functools
import os
import resource
import select
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from devstack.sim.errors import SimStartupError
from devstack.sim.group.protocol import (
    CAUSE_FINISHED,
    CAUSE_LEFT,
    CAUSE_TIMED_OUT,
    Channel,
    PeerGone,
    connect,
)
from devstack.sim.records import CLEANUP_INTERRUPTED, RecordWriter
from devstack.sim.signals import SignalLatch

STEP_RECORD_INTERVAL_S = 0.2
"""The record's ``steps`` is rewritten at most this often while stepping (a file write per
token per rank would load the machine the tests measure); it is exact at the end."""


@dataclass(frozen=True)
class Place:
    """Where a rank is in the group."""

    rank: int
    world_size: int
    timeout_s: float
    """How long a step may take before the rank aborts (``--collective-timeout-s``)."""


class Collective:
    """What both sides share: the step count, the record, and the hang-then-abort."""

    def __init__(self, place: Place, record: RecordWriter, latch: SignalLatch) -> None:
        self.rank = place.rank
        self.world_size = place.world_size
        self.timeout_s = place.timeout_s
        self.record = record
        self.latch = latch
        self.steps = 0
        self.finished = False
        """The group finished (rank 0 told this rank so, or, on rank 0, it told them all):
        the rank stops serving and runs its cleanup."""
        self._written_at = 0.0

    def fds(self) -> dict[int, Callable[[], None]]:
        raise NotImplementedError

    def note_step(self, n: int) -> None:
        self.steps = n
        now = time.monotonic()
        if now - self._written_at >= STEP_RECORD_INTERVAL_S:
            self._written_at = now
            self.record.update(steps=n)

    def hang(self, step: int | None, waiting_for: Iterable[int], why: str) -> None:
        """Note (once) that the collective cannot complete, and why."""
        if self.record.data.get("hung") is None:
            self.record.update(hung={"step": step, "waiting_for": sorted(waiting_for),
                                     "why": why, "since": time.time()})

    def hang_until(self, deadline: float, step: int | None, waiting_for: Iterable[int],
                   why: str) -> NoReturn:
        """Hang like a collective whose peer is gone: signals are only noted (the thread is
        stuck), and the watchdog aborts at the deadline."""
        waiting = sorted(waiting_for)
        self.hang(step, waiting, why)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(left)
        self.abort(step, waiting)

    def abort(self, step: int | None, waiting_for: Iterable[int]) -> NoReturn:
        """End as NCCL's watchdog ends a rank: record why, then ``abort()`` (SIGABRT)."""
        waiting = sorted(waiting_for)
        what = f"step {step}" if step is not None else "the group"
        self.hang(step, waiting, "no answer")
        # Whom it still waited for at the end, which may be fewer than when it began to hang.
        self.record.update(hung={**self.record.data["hung"], "waiting_for": waiting})
        for signum in self.latch.take():
            self.record.signalled(signum)
        self.record.update(steps=self.steps, cause=CAUSE_TIMED_OUT)
        self.record.ended(-signal.SIGABRT, cleanup=CLEANUP_INTERRUPTED,
                          detail=f"{CAUSE_TIMED_OUT}: {what} waited {self.timeout_s:g} s for "
                                 f"rank(s) {waiting}")
        # An abort, not a core file left in whatever directory the rank runs in.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.abort()


class Root(Collective):
    """Rank 0: the rendezvous, the hub of every step, and the one that finishes the group."""

    def __init__(self, place: Place, record: RecordWriter, latch: SignalLatch,
                 listener: socket.socket) -> None:
        super().__init__(place, record, latch)
        self.listener = listener
        self.members: dict[int, Channel] = {}
        self.lost: dict[int, str] = {}
        """Ranks whose connection ended, and how."""
        self.driver: Channel | None = None
        """The front end (the leader's main process) asking for steps."""
        self._newcomers: list[Channel] = []

    # --- forming the group ---------------------------------------------------------------

    def form(self, deadline: float) -> None:
        """1. Accept connections until every other rank has joined (by the deadline).
        2. Welcome each one: the group is formed, every rank may report ready."""
        while len(self.members) < self.world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, self.world_size)) - set(self.members))
                raise SimStartupError(f"ranks {missing} did not join rank 0 in time")
            newcomers = {c.fileno(): c for c in self._newcomers}
            listening = self.listener.fileno()
            for fd in select.select([listening, *newcomers], [], [], left)[0]:
                if fd == listening:
                    self._accept()
                else:
                    self._greet(newcomers[fd], forming=True)
        for channel in self.members.values():
            channel.send({"op": "welcome", "world_size": self.world_size})
        self.record.update(world_size=self.world_size)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        self._newcomers.append(Channel(conn))

    def _greet(self, channel: Channel, *, forming: bool) -> None:
        """A new connection's first message says who it is: a rank, or the front end. Once
        the group is formed only the front end is let in: a rank joining then would join a
        group whose communicator is already built."""
        channel.fill()
        if not channel.inbox:
            if channel.gone:
                self._newcomers.remove(channel)
                channel.close()
            return
        self._newcomers.remove(channel)
        hello = channel.inbox.popleft()
        rank = hello.get("rank")
        if hello.get("op") == "drive" and self.driver is None:
            self.driver = channel
            channel.send({"op": "driving", "world_size": self.world_size})
        elif (forming and hello.get("op") == "join" and isinstance(rank, int)
              and 0 < rank < self.world_size and rank not in self.members):
            self.members[rank] = channel
        else:  # a second front end, a rank already there, or one after the group formed
            channel.close()

    # --- serving -------------------------------------------------------------------------

    def fds(self) -> dict[int, Callable[[], None]]:
        watched: dict[int, Callable[[], None]] = {self.listener.fileno(): self._accept}
        for channel in self._newcomers:
            watched[channel.fileno()] = functools.partial(self._greet, channel, forming=False)
        for rank, channel in self.members.items():
            if rank not in self.lost:
                watched[channel.fileno()] = functools.partial(self._member_readable, rank)
        if self.driver is not None:
            watched[self.driver.fileno()] = self._driver_readable
        return watched

    def _member_readable(self, rank: int) -> None:
        channel = self.members[rank]
        channel.fill()
        channel.inbox.clear()  # between steps a rank has nothing to say
        if channel.gone:
            self._lose(rank, "closed its connection")

    def _lose(self, rank: int, why: str) -> None:
        if rank not in self.lost:
            self.lost[rank] = why
            self.record.update(peers_lost={str(r): w for r, w in self.lost.items()})

    def _driver_readable(self) -> None:
        driver = self.driver
        assert driver is not None
        driver.fill()
        while driver.inbox and not self.finished:
            op = driver.inbox.popleft().get("op")
            if op == "step":
                driver.send({"op": "stepped", "n": self.step()})
            elif op == "finish":
                driver.send({"op": "finished", "ranks": self.finish(), "steps": self.steps})
        if driver.gone:  # the front end is gone: PDEATHSIG follows
            self.driver = None

    def step(self) -> int:
        """One generation step across the group.

        1. Send step K to every rank still connected.
        2. Wait for every rank's ack, up to the timeout. A rank gone makes it hang, as a
           collective with a dead peer does; at the timeout rank 0 aborts.
        3. Tell every rank the step completed.
        """
        n = self.steps + 1
        for rank, channel in self.members.items():
            if rank not in self.lost and not channel.send({"op": "step", "n": n}):
                self._lose(rank, "could not be sent the step")
        waiting = set(self.members)
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            live = {self.members[r].fileno(): r for r in waiting if r not in self.lost}
            if len(live) < len(waiting):
                gone = sorted(waiting - set(live.values()))
                self.hang(n, waiting, "; ".join(f"rank {r} {self.lost[r]}" for r in gone))
            left = deadline - time.monotonic()
            if left <= 0:
                self.abort(n, waiting)
            if not live:
                time.sleep(left)
                continue
            for fd in select.select(list(live), [], [], left)[0]:
                rank = live[fd]
                channel = self.members[rank]
                channel.fill()
                while channel.inbox:
                    message = channel.inbox.popleft()
                    if message.get("op") == "ack" and message.get("n") == n:
                        waiting.discard(rank)
                if channel.gone:
                    self._lose(rank, "closed its connection")
        for rank, channel in self.members.items():
            if rank not in self.lost:
                channel.send({"op": "done", "n": n})
        self.note_step(n)
        return n

    def finish(self) -> dict[str, str]:
        """End the group cleanly (SGLang's ``ShutdownReq`` broadcast from rank 0).

        1. Tell every rank still connected to finish.
        2. Wait for each one's bye, up to the timeout.
        3. Record how each answered: ``bye``, ``gone`` or ``no answer``.
        """
        answers: dict[str, str] = {}
        told: dict[int, Channel] = {}
        for rank, channel in self.members.items():
            if rank not in self.lost and channel.send({"op": "finish"}):
                told[rank] = channel
            else:
                answers[str(rank)] = "gone"
        deadline = time.monotonic() + self.timeout_s
        for rank, channel in told.items():
            answers[str(rank)] = _bye(channel, deadline)
        self.finished = True
        self.record.update(cause=CAUSE_FINISHED, finish=answers, steps=self.steps)
        return answers


    def leave(self) -> None:
        """Leave on this rank's own SIGTERM without finishing the group (an SGLang
        scheduler's way): every connection closes, so every other rank hangs, then aborts."""
        for channel in (*self.members.values(), *self._newcomers, self.driver):
            if channel is not None:
                channel.close()
        self.listener.close()
        self.record.update(cause=CAUSE_LEFT, steps=self.steps)


def _bye(channel: Channel, deadline: float) -> str:
    """How a rank told to finish answered: ``bye``, ``gone`` or ``no answer``."""
    try:
        while (message := channel.next(deadline)) is not None:
            if message.get("op") == "bye":
                return "bye"
    except PeerGone:
        return "gone"
    return "no answer"


class Member(Collective):
    """Every rank but 0: joins rank 0, takes part in each step, leaves when told."""

    def __init__(self, place: Place, record: RecordWriter, latch: SignalLatch) -> None:
        super().__init__(place, record, latch)
        self.root: Channel | None = None

    def join(self, addr: str, node_rank: int, deadline: float) -> None:
        """1. Reach rank 0 (retrying: the leader pod may not listen yet). 2. Say who this
        is. 3. Wait for the welcome that says every rank is there."""
        root = connect(addr, deadline)
        root.send({"op": "join", "rank": self.rank, "pid": os.getpid(), "node_rank": node_rank})
        try:
            welcome = root.next(deadline)
        except PeerGone:
            welcome = None
        if welcome is None or welcome.get("op") != "welcome":
            raise SimStartupError(f"rank 0 at {addr} did not welcome rank {self.rank} in time")
        self.root = root
        self.record.update(world_size=self.world_size)

    def fds(self) -> dict[int, Callable[[], None]]:
        return {} if self.root is None else {self.root.fileno(): self._root_readable}

    def _root_readable(self) -> None:
        root = self.root
        assert root is not None
        root.fill()
        while root.inbox and not self.finished:
            message = root.inbox.popleft()
            if message.get("op") == "step":
                self._step(root, int(message["n"]))
            elif message.get("op") == "finish":
                root.send({"op": "bye", "steps": self.steps})
                self.finished = True
                self.record.update(cause=CAUSE_FINISHED, steps=self.steps)
        if root.gone and not self.finished:
            self.hang_until(time.monotonic() + self.timeout_s, None, [0],
                            "rank 0 closed its connection (the group's store was its)")

    def _step(self, root: Channel, n: int) -> None:
        """Ack step K, then wait until rank 0 says every rank did (the all-reduce)."""
        root.send({"op": "ack", "n": n})
        deadline = time.monotonic() + self.timeout_s
        try:
            while (message := root.next(deadline)) is not None:
                if message.get("op") == "done" and message.get("n") == n:
                    self.note_step(n)
                    return
        except PeerGone:
            self.hang_until(deadline, n, [0], "rank 0 closed its connection mid-step")
        self.abort(n, [0])

    def leave(self) -> None:
        """Leave on this rank's own SIGTERM: close the connection, as a process that exits
        does. Rank 0 finds out at its next step, which then cannot complete."""
        if self.root is not None:
            self.root.close()
            self.root = None
        self.record.update(cause=CAUSE_LEFT, steps=self.steps)
