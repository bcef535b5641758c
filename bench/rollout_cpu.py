"""Where the machine's CPU goes during a rollout: each part's share of the cores, steady state
against the rollout, read from ``/proc``.

    with CpuByRole() as cpu:            # a thread of the bench samples from here (or
        ...                             # start() and stop()); note the windows' ends
    cpu.cores(start, end)               # {"coordinator": 0.45, "engine": 0.37, ...}

Every ``SAMPLE_S`` a thread reads the CPU time (user + system) of each process of the
bench's own tree, and charges it to a part by the process's command line, or its nearest
ancestor's that has one (a process seen once outside the bench's tree is not read again:
a PID reused by a process of the tree within the run would go uncounted):

- ``coordinator``: ``python -m coordinator serve``;
- ``engine``: the simulated engine (``devstack.logged_engine`` or ``devstack.sim``) and
  the children it starts (scheduler, detokenizer);
- ``proxy``: ``python -m continuation_proxy``;
- ``load``: the clients (``bench.rollout_load``);
- ``router``: ``smg`` (which renames itself ``smg::router``);
- ``hook``: the preStop hooks (``drain_hook.py``);
- ``rig``: the bench itself (this thread included), and any process it started that is none
  of the above.

A part's cores over a window are the CPU time its processes used between the samples
nearest the window's ends, over the window's length (2.0 is the whole of a 2-core machine).
A process that ends between two samples loses what it used since the last one, at most
``SAMPLE_S`` of it. Each sample reads one ``stat`` per process of the tree (and, once, the
command line of each new one): about a millisecond, every ``SAMPLE_S``, charged to the rig.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import TracebackType

SAMPLE_S = 0.05
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PARTS = (
    ("coordinator", ("-m coordinator serve",)),
    ("engine", ("devstack.logged_engine", "-m devstack.sim")),
    ("proxy", ("-m continuation_proxy",)),
    ("load", ("bench.rollout_load",)),
    ("router", ("/smg ", "smg launch", "smg::")),  # smg names itself smg::router
    ("hook", ("drain_hook.py",)),
)


def part_of(command: str) -> str | None:
    """The part a command line names, if any."""
    for part, marks in PARTS:
        if any(mark in command for mark in marks):
            return part
    return None


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent PID, CPU seconds used) of ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) + " "


class CpuByRole:
    """Samples the bench's process tree from ``start`` (or ``__enter__``) to ``stop``."""

    def __init__(self, sample_s: float = SAMPLE_S) -> None:
        self.sample_s = sample_s
        self.root = os.getpid()
        self.times: list[float] = []
        """``time.monotonic()`` of each sample."""
        self.used: list[dict[str, float]] = []
        """Each sample's CPU seconds by part, summed over its processes (a process's whole
        use so far)."""
        self._parts: dict[int, str | None] = {self.root: "rig"}
        """Each process whose part is settled: its part, or None when not of the bench's tree
        (a process not exec'd yet is not settled: it is its parent's part until it is)."""
        self._commands: dict[int, str] = {}
        """The command line each settled process had (a child with the same one has not
        exec'd yet)."""
        self._live: dict[int, tuple[str, float]] = {}
        """Each live process of the tree as of the last sample: the part it was charged to
        and the CPU seconds it had used."""
        self._gone: defaultdict[str, float] = defaultdict(float)
        """What processes that ended had used at their last sample, by part."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-by-role", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The last sample taken; returns once the thread ended (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> CpuByRole:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.sample_s)

    def sample(self) -> None:
        """One look at every process (taken by the thread; callable directly in tests)."""
        now = time.monotonic()
        live: dict[int, tuple[str, float]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in self._parts and self._parts[pid] is None:
                continue  # not of the bench's tree: not read again
            stat = _stat(pid)
            part = None if stat is None else self._part(pid, stat[0])
            if stat is not None and part is not None:
                live[pid] = (part, stat[1])
        for pid, (part, used) in self._live.items():
            if pid not in live:  # ended: keep what it had used
                self._gone[part] += used
        self._live = live
        total: defaultdict[str, float] = defaultdict(float, self._gone)
        for part, used in live.values():
            total[part] += used
        self.times.append(now)
        self.used.append(total)

    def _part(self, pid: int, parent: int) -> str | None:
        if pid in self._parts:
            return self._parts[pid]
        if parent in self._parts:
            inherited = self._parts[parent]
        else:  # a parent not settled yet, or listed after its child: its part as of now
            stat = _stat(parent) if parent > 1 else None
            inherited = None if stat is None else self._part(parent, stat[0])
        if inherited is None:
            self._parts[pid] = None
            return None
        command = _command(pid)
        if parent not in self._commands:
            self._commands[parent] = _command(parent)
        if not command or command == self._commands[parent]:
            # Forked and not (yet) exec'd, or in the middle of its exec (no command line for
            # a moment): its parent's part for now, and looked at again next time.
            return inherited
        self._commands[pid] = command
        self._parts[pid] = part_of(command) or inherited
        return self._parts[pid]

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Each part's cores between the samples nearest ``start`` and ``end``."""
        if len(self.times) < 2 or end <= start:
            return {}
        first, last = self._nearest(start), self._nearest(end)
        span = self.times[last] - self.times[first]
        if span <= 0:
            return {}
        before, after = self.used[first], self.used[last]
        return {part: round((after[part] - before.get(part, 0.0)) / span, 3)
                for part in sorted(after, key=lambda p: -(after[p] - before.get(p, 0.0)))}

    def _nearest(self, at: float) -> int:
        i = bisect.bisect_left(self.times, at)
        if i == len(self.times):
            return i - 1
        if i > 0 and at - self.times[i - 1] < self.times[i] - at:
            return i - 1
        return i
