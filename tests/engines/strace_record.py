"""Each process's end as the kernel told it to strace, and who sent the signals that ended it.

``strace -f -tt -e trace=kill,tgkill,pidfd_send_signal,exit_group`` attached to every process
of an engine's tree (``-p`` each, ``-f`` for what they start later) writes one line per event:

    15327 20:15:15.621531 kill(15466, SIGKILL) = 0
    15466 20:15:15.899036 +++ killed by SIGKILL +++
    15465 20:15:14.297636 +++ exited with 0 +++
    15327 20:15:03.044078 --- SIGTERM {si_signo=SIGTERM, si_code=SI_USER, si_pid=16373, ...} ---

That is ground truth independent of the coordinator: the exit status of every process (also
those that are not the test's children), the catchable signals each received with the
sender's PID, and every signal a traced process sent (SIGKILL cannot be caught, so who sent a
SIGKILL is read from the sender's ``kill`` call). A SIGKILL that no traced process sent came
from outside the tree: the coordinator, or the kernel's ``PR_SET_PDEATHSIG``.

Only the signal-sending syscalls and ``exit_group`` are traced, so the engine runs at its
usual speed (a 200-token completion took 4.0 s traced and 4.3 s untraced here).
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TRACED = "trace=kill,tgkill,pidfd_send_signal,exit_group"

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d\d:\d\d:\d\d\.\d+)\s+(?P<rest>.*)$")
_EXITED = re.compile(r"^\+\+\+ exited with (?P<code>\d+) \+\+\+$")
_KILLED = re.compile(r"^\+\+\+ killed by (?P<sig>SIG\w+)(?: \(core dumped\))? \+\+\+$")
_RECEIVED = re.compile(
    r"^--- (?P<sig>SIG\w+) \{.*?si_code=(?P<code>\w+)(?:, si_pid=(?P<from>\d+))?")
_KILL_CALL = re.compile(r"^kill\((?P<target>-?\d+), (?P<sig>SIG\w+)\)\s+=\s+0")


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
    """Sender PID → the signals it sent with ``kill``."""

    def end(self, pid: int) -> ProcessEnd:
        return self.ends.setdefault(pid, ProcessEnd(pid))

    def senders_of(self, target: int, sig: str) -> list[int]:
        """Traced processes that sent ``sig`` to ``target`` (with ``kill``)."""
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


def parse(text: str) -> Record:
    record = Record()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        pid, at, rest = int(match["pid"]), match["time"], match["rest"]
        if m := _EXITED.match(rest):
            end = record.end(pid)
            end.exit_code, end.at = int(m["code"]), at
        elif m := _KILLED.match(rest):
            end = record.end(pid)
            end.killed_by, end.at = m["sig"], at
        elif m := _RECEIVED.match(rest):
            if m["sig"] != "SIGCHLD":
                sender = int(m["from"]) if m["from"] else None
                record.end(pid).received.append(Received(m["sig"], sender, at))
        elif m := _KILL_CALL.match(rest):
            record.sent.setdefault(pid, []).append(Sent(int(m["target"]), m["sig"], at))
    return record


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
