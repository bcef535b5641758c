"""Each process's end as the kernel told it to strace, and who sent the signals that ended it.

``strace -f -tt -e trace=kill,tgkill,pidfd_send_signal,exit_group,clone,clone3`` attached to
every process of an engine's tree (``-p`` each, ``-f`` for its threads and what it starts
later) writes one line per event, each under the id of the thread it happened in:

    15327 20:15:15.621531 kill(15466, SIGKILL) = 0
    15466 20:15:15.899036 +++ killed by SIGKILL +++
    15465 20:15:14.297636 +++ exited with 0 +++
    15327 20:15:03.044078 --- SIGTERM {si_signo=SIGTERM, si_code=SI_USER, si_pid=16373, ...} ---

That is ground truth independent of the coordinator: the exit status of every process (also
those that are not the test's children), the catchable signals each received with the
sender's PID, and every signal a traced process sent (SIGKILL cannot be caught, so who sent a
SIGKILL is read from the sender's ``kill`` call). A SIGKILL that no traced process sent came
from outside the tree: the coordinator, or the kernel's ``PR_SET_PDEATHSIG``.

A signal sent to a process is taken by any one of its threads that does not block it (in
SGLang's main process, often not the main thread), and a thread may call ``kill``; so each
event is put down to the process the thread belongs to: the threads a process had when strace
attached (``/proc/PID/task``, passed to ``parse``), and those it started later (a ``clone``
with ``CLONE_THREAD``). A thread's own end is not its process's end: only the main thread's
(thread id = PID) is kept.

Only the signal-sending syscalls, ``exit_group`` and ``clone`` are traced, so the engine runs
at its usual speed (a 200-token completion took 4.0 s traced and 4.3 s untraced here).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TRACED = "trace=kill,tgkill,pidfd_send_signal,exit_group,clone,clone3"

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d\d:\d\d:\d\d\.\d+)\s+(?P<rest>.*)$")
_EXITED = re.compile(r"^\+\+\+ exited with (?P<code>\d+) \+\+\+$")
_KILLED = re.compile(r"^\+\+\+ killed by (?P<sig>SIG\w+)(?: \(core dumped\))? \+\+\+$")
_RECEIVED = re.compile(
    r"^--- (?P<sig>SIG\w+) \{.*?si_code=(?P<code>\w+)(?:, si_pid=(?P<from>\d+))?")
_KILL_CALL = re.compile(r"^(?:kill\((?P<target>-?\d+)|tgkill\((?P<tgid>\d+), \d+), "
                        r"(?P<sig>SIG\w+)\)\s+=\s+(?P<ret>0|\?)")
_KILL_UNFINISHED = re.compile(r"^kill\((?P<target>-?\d+), (?P<sig>SIG\w+)$")
_CLONE = re.compile(r"^clone3?\((?P<args>.*)\)\s+=\s+(?P<child>\d+)$")
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^<\.\.\. \w+ resumed>(?P<tail>.*)$")


@dataclass
class Received:
    signal: str
    sender: int | None
    """PID of the process that sent it (``si_pid``), when it was sent by a process."""
    at: str


@dataclass
class Sent:
    target: int
    signal: str
    at: str


@dataclass
class ProcessEnd:
    """One process as strace saw it end: an exit code, or the signal that killed it."""

    pid: int
    exit_code: int | None = None
    killed_by: str | None = None
    at: str | None = None
    received: list[Received] = field(default_factory=list)

    @property
    def wait_status(self) -> int | None:
        """subprocess's convention: the exit code, or minus the signal's number."""
        if self.killed_by is not None:
            return -int(signal.Signals[self.killed_by])
        return self.exit_code

    def describe(self) -> str:
        if self.killed_by is not None:
            return self.killed_by
        return "running" if self.exit_code is None else f"exit {self.exit_code}"


@dataclass
class Record:
    """Everything one strace run saw."""

    ends: dict[int, ProcessEnd] = field(default_factory=dict)
    sent: dict[int, list[Sent]] = field(default_factory=dict)
    """Sender PID → the signals its threads sent with ``kill`` or ``tgkill``."""

    def end(self, pid: int) -> ProcessEnd:
        return self.ends.setdefault(pid, ProcessEnd(pid))

    def senders_of(self, target: int, sig: str) -> list[int]:
        """Traced processes that sent ``sig`` to ``target`` (with ``kill`` or ``tgkill``)."""
        return sorted(pid for pid, calls in self.sent.items()
                      if any(c.target == target and c.signal == sig for c in calls))

    def who_killed(self, pid: int) -> str:
        """For a process that died of a signal: which traced process sent it, or
        ``outside`` (the coordinator, or the kernel's PDEATHSIG)."""
        end = self.ends.get(pid)
        if end is None or end.killed_by is None:
            return "-"
        senders = self.senders_of(pid, end.killed_by)
        if senders:
            return ",".join(str(s) for s in senders)
        received = [r for r in end.received if r.signal == end.killed_by]
        if received and received[-1].sender is not None:
            return str(received[-1].sender)
        return "outside"


def _events(text: str) -> tuple[list[tuple[int, str, str]], list[tuple[int, str, str]]]:
    """(thread id, time, event) per line, a call strace split in two (``<unfinished ...>``,
    then ``<... NAME resumed>`` when another thread printed in between) joined again; and
    the calls never resumed (the thread died in them: ``kill(getpid(), SIGKILL)``)."""
    pending: dict[int, tuple[str, str]] = {}
    out = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        tid, at, rest = int(match["pid"]), match["time"], match["rest"]
        if rest.endswith(_UNFINISHED):
            pending[tid] = (at, rest[: -len(_UNFINISHED)])
            continue
        if m := _RESUMED.match(rest):
            rest = pending.pop(tid, (at, ""))[1] + m["tail"]
        out.append((tid, at, rest))
    return out, [(tid, at, rest) for tid, (at, rest) in pending.items()]


def parse(text: str, threads: Mapping[int, int] | None = None) -> Record:
    """``threads``: thread id → PID of the threads the traced processes had when strace
    attached (``process_threads``)."""
    events, unfinished = _events(text)
    owner = dict(threads or {})
    creator = {int(m["child"]): tid for tid, _, rest in events
               if (m := _CLONE.match(rest)) and "CLONE_THREAD" in m["args"]}

    def process_of(tid: int) -> int:
        while tid not in owner and tid in creator:
            tid = creator[tid]
        return owner.get(tid, tid)

    record = Record()
    died_in: list[tuple[int, Sent]] = []
    for tid, at, rest in events:
        pid = process_of(tid)
        if m := _EXITED.match(rest):
            if tid == pid:
                end = record.end(pid)
                end.exit_code, end.at = int(m["code"]), at
        elif m := _KILLED.match(rest):
            if tid == pid:
                end = record.end(pid)
                end.killed_by, end.at = m["sig"], at
        elif m := _RECEIVED.match(rest):
            if m["sig"] != "SIGCHLD":
                sender = int(m["from"]) if m["from"] else None
                record.end(pid).received.append(Received(m["sig"], sender, at))
        elif m := _KILL_CALL.match(rest):
            call = Sent(int(m["target"] or m["tgid"]), m["sig"], at)
            if m["ret"] == "?":
                died_in.append((pid, call))
            else:
                record.sent.setdefault(pid, []).append(call)
    died_in += [(process_of(tid), Sent(int(m["target"]), m["sig"], at))
                for tid, at, rest in unfinished if (m := _KILL_UNFINISHED.match(rest))]
    # A kill its sender died in (``= ?``, or never resumed: SGLang's kill_process_tree ends
    # with its own process) was sent if its target then died of that signal.
    for sender, call in died_in:
        target_end = record.ends.get(call.target)
        if target_end is not None and target_end.killed_by == call.signal:
            record.sent.setdefault(sender, []).append(call)
    return record


def process_threads(pids: Iterable[int]) -> dict[int, int]:
    """Thread id → PID, for every thread each of ``pids`` has now."""
    owner = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                owner[int(task)] = pid
    return owner


def attach_argv(pids: Iterable[int], out: Path) -> list[str]:
    """The strace command line that attaches to ``pids`` (and what they start later)."""
    argv = ["strace", "-f", "-tt", "-e", TRACED, "-o", str(out)]
    for pid in pids:
        argv += ["-p", str(pid)]
    return argv


def available() -> bool:
    try:
        return subprocess.run(["strace", "-V"], capture_output=True, check=False).returncode == 0
    except OSError:
        return False
