"""Start real processes in tests, and fail the test that leaves one behind.

Every process a test starts goes through a ``ProcessJanitor`` (the ``janitor`` fixture), in
a session of its own by default. When the test ends, every one of them, and everything they
started, must be gone. The janitor finds what is left the way the coordinator finds a tree:

- what it started (``spawn``), identified by PID and start time, and what the test handed it
  with ``adopt``;
- ancestry: the live descendants of anything found;
- the sessions and process groups it started (a session is only made by ``setsid``, so its
  members descend from the leader even after they were reparented away), and those led by
  anything found;
- children of the test process itself that were born during the test and not started
  through the janitor.

Whatever is still running then is a leak: the janitor records each one (PID, name, command
line, how it was found), SIGTERMs it, SIGKILLs it after ``TERM_GRACE_S``, and the test fails
in its teardown. A process already on its way out (exiting, or with a SIGKILL pending) is
waited for, not blamed; a zombie has ended (the test's own children are reaped).

Services are the exception the test declares: ``spawn(..., service=True)`` (or
``service(proc)`` for one started through ``spawn``) marks a process the test deliberately
leaves running for the janitor to stop, such as a coordinator, a router or a simulated engine
that is only scenery. At the end each live service gets SIGTERM and must exit on its own
within ``stop_within_s`` (``SERVICE_STOP_S``) with its declared exit code (0 unless told),
leaving nothing of its tree behind; needing SIGKILL, or another code, fails the test. They
are stopped one at a time, the last started first, as an exit stack unwinds: an engine stops
while the coordinator it reports to still answers. A service that already ended before that
is the test's business.

Runtime files: each janitor gives the processes it starts a runtime directory of their own
(``XDG_RUNTIME_DIR``, unless the test sets one), so whatever is left in it at the end was
made by the test's processes: the doorbell pipe a coordinator makes there with
``--doorbell auto`` (``shutdown-coordinator-doorbell-<pid>``) is removed by the coordinator
when it stops, and anything left there fails the test. The same pipe named after any
process the janitor knew, in the directory ``auto`` would use for it, fails it too.

Nothing outside what was found is ever signalled; every signal goes through a pidfd opened
and checked against the process's start time, so a reused PID is never hit. Nothing outlives
the test, even a failing one: the SIGKILL fallback runs whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

TERM_GRACE_S = 5.0
"""How long a leaked process gets between SIGTERM and SIGKILL."""
SERVICE_STOP_S = 15.0
"""How long a service gets to exit on its own after SIGTERM."""
RUNTIME_PREFIX = "shutdown-coordinator"
"""What the coordinator's files in a runtime directory are named after."""
DOORBELL_PREFIX = f"{RUNTIME_PREFIX}-doorbell-"
"""``coordinator.service.doorbell.AUTO_PREFIX``: ``--doorbell auto`` makes the pipe
``<runtime dir>/shutdown-coordinator-doorbell-<pid of the coordinator>``."""
PF_EXITING = 0x4
"""``/proc/<pid>/stat`` flags bit of a process that has started to exit."""
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
_CMDLINE_SHOWN = 300


@dataclass(frozen=True, slots=True)
class _Stat:
    pid: int
    name: str
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    ticks: int
    """Clock ticks from boot to the process's creation: with the PID, its identity."""
    arg_end: int
    """Where its command line ends in its memory: 0 while an exec has not yet laid the new
    program's arguments out (and once it has no memory left: exiting, or a kernel thread)."""

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def mid_exec(self) -> bool:
        """Alive, not exiting, and without a command line of its own yet: between the
        kernel's switch to the new program's memory and the layout of its arguments,
        ``/proc/<pid>/cmdline`` reads empty (and, earlier in that window, the name may
        still be the old program's)."""
        return not self.zombie and not self.flags & PF_EXITING and self.arg_end == 0


def _read_stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    close_at = text.rindex(")")
    rest = text[close_at + 2 :].split()
    return _Stat(pid=pid, name=text[text.index("(") + 1 : close_at], state=rest[0],
                 ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]), flags=int(rest[6]),
                 ticks=int(rest[19]), arg_end=int(rest[46]))


def _scan() -> dict[int, _Stat]:
    out: dict[int, _Stat] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _read_stat(int(entry))) is not None:
            out[s.pid] = s
    return out


EXEC_WAIT_S = 30.0
"""Longest wait for a process to finish laying out its new program (``_settled``): it only
bounds a failure (a process that never does), so it is generous for a loaded machine."""


def _settled(pid: int) -> _Stat | None:
    """``pid`` read once it is not in the middle of an exec (``_Stat.mid_exec``), or has
    ended; None when it is gone.

    Every description the janitor gives of a process (its name and command line) is read
    through this: a process found mid-exec would otherwise be described with an empty
    command line. ``Popen`` returns in that window (the close-on-exec error pipe closes
    early in the kernel's exec), and a child the test or its processes started that way is
    often still in it when the janitor looks: most of 2,000 read at once, on an idle
    machine. Before its exec a child shows its parent's command line, which is its own
    true one then. The kernel offers no event for an exec's end, so this polls ``stat``."""
    deadline = time.monotonic() + EXEC_WAIT_S
    while True:
        seen = _read_stat(pid)
        if seen is None or not seen.mid_exec or time.monotonic() > deadline:
            return seen
        time.sleep(0.0005)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    text = text.replace("\n", "\\n")
    return text if len(text) <= _CMDLINE_SHOWN else text[:_CMDLINE_SHOWN] + "..."


def _ending(pid: int, seen: _Stat) -> bool:
    """Already on its way out: exiting, or a SIGKILL is pending."""
    if seen.flags & PF_EXITING:
        return True
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) \
                        & _SIGKILL_BIT:
                    return True
    except (OSError, ValueError, IndexError):
        return True  # gone while we looked
    return False


def _ancestors(pid: int) -> set[int]:
    out: set[int] = set()
    while (s := _read_stat(pid)) is not None and s.ppid > 0 and s.ppid not in out:
        out.add(s.ppid)
        pid = s.ppid
    return out


def auto_dir(env: Mapping[str, str]) -> Path:
    """Where ``--doorbell auto`` puts the pipe of a coordinator running with ``env``
    (``coordinator.service.doorbell.auto_dir``: ``$XDG_RUNTIME_DIR`` when usable, else the
    temp directory)."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        return Path(runtime)
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = env.get(name)
        if value and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
            return Path(value)
    return Path(tempfile.gettempdir())


@dataclass(eq=False)
class _Started:
    """A process ``spawn`` started."""

    proc: subprocess.Popen[Any]
    ticks: int | None
    session: bool
    runtime_dir: Path
    service: bool = False
    exit_code: int = 0
    stop_within_s: float = SERVICE_STOP_S
    judged: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True, slots=True)
class Found:
    """A live process the janitor is responsible for."""

    pid: int
    ticks: int
    name: str
    cmdline: str
    how: str
    """How it was found: ``started by the test``, ``child of 123``, ``in session 120 ...``."""
    service: _Started | None = field(default=None, compare=False)
    """The service whose tree it is part of (its own to end), if any."""

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name}) `{self.cmdline}` [{self.how}]"


@dataclass
class _Handle:
    """A found process held by a pidfd (so a signal cannot reach a reused PID)."""

    found: Found
    fd: int
    ended: bool = False
    blamed: bool = False
    """Reported: it was running (not already on its way out) when found."""
    killed: bool = False


class ProcessJanitor:
    """Owns every process a test starts; ``close()`` ends whatever is left and ``check()``
    fails the test when anything had to be ended (see the module's docstring)."""

    def __init__(self) -> None:
        self._started: list[_Started] = []
        self._adopted: list[tuple[int, int]] = []
        self._known: dict[int, int] = {}
        """PID to start ticks of every process found (their runtime files are checked)."""
        self.problems: list[str] = []
        self._me = os.getpid()
        self._excluded = {0, 1, self._me, *_ancestors(self._me)}
        self._own_keys = {os.getsid(0), os.getpgid(0)}
        snap = _scan()
        self._children_before = {(s.pid, s.ticks) for s in snap.values() if s.ppid == self._me}
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="janitor-runtime-"))
        """The ``XDG_RUNTIME_DIR`` of the processes this janitor starts (unless told)."""
        self._own_auto = auto_dir(os.environ)
        self._runtime_dirs: set[Path] = {self._own_auto}
        self._before = {d: _entries(d) for d in self._runtime_dirs}
        self._reported: set[Path] = set()

    # Starting and tracking.

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        new_session: bool = True,
        service: bool = False,
        exit_code: int = 0,
        stop_within_s: float = SERVICE_STOP_S,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` (in a new session by default) and track it.

        ``service=True``: the test leaves it running on purpose; at the end it gets SIGTERM
        and must exit with ``exit_code`` within ``stop_within_s``, its tree with it."""
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        if full_env.get("XDG_RUNTIME_DIR") == os.environ.get("XDG_RUNTIME_DIR"):
            full_env["XDG_RUNTIME_DIR"] = str(self.runtime_dir)
        proc = subprocess.Popen(
            list(argv),
            env=full_env,
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            text=text,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
        )
        seen = _settled(proc.pid)  # our child: readable until we reap it
        started = _Started(proc, None if seen is None else seen.ticks, new_session,
                           auto_dir(full_env))
        self._started.append(started)
        if started.ticks is not None:
            self._known[proc.pid] = started.ticks
        if started.runtime_dir not in self._runtime_dirs:
            self._runtime_dirs.add(started.runtime_dir)
            self._before[started.runtime_dir] = _entries(started.runtime_dir)
        if service:
            self.service(proc, exit_code=exit_code, stop_within_s=stop_within_s)
        return proc

    def spawn_python(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return self.spawn([sys.executable, *args], **kwargs)

    def service(self, proc: object, *, exit_code: int = 0,
                stop_within_s: float = SERVICE_STOP_S) -> None:
        """Declare ``proc`` (a ``Popen`` ``spawn`` returned, or its PID) a service the janitor
        stops at the end: SIGTERM, then it must exit ``exit_code`` within ``stop_within_s``."""
        for started in reversed(self._started):
            if started.proc is proc or (isinstance(proc, int) and started.pid == proc):
                started.service = True
                started.exit_code = exit_code
                started.stop_within_s = stop_within_s
                return
        raise ValueError(f"{proc!r} was not started by this janitor")

    def adopt(self, pid: int) -> None:
        """Track a process started by something else (e.g. a daemonised child)."""
        seen = _read_stat(pid)
        if seen is not None and not seen.zombie:
            self._adopted.append((pid, seen.ticks))
            self._known[pid] = seen.ticks

    # Finding.

    def _find(self, snap: Mapping[int, _Stat]) -> dict[int, Found]:
        found: dict[int, Found] = {}

        def add(pid: int, how: str, service: _Started | None, ticks: int | None = None) -> bool:
            seen = snap.get(pid)
            if (seen is None or seen.zombie or pid in found or pid in self._excluded
                    or (ticks is not None and seen.ticks != ticks)):
                return False
            # Read again, not from the snapshot: it may have begun an exec since.
            now = _settled(pid)
            if now is not None and now.ticks == seen.ticks:
                seen = now  # its own name now, not the program it replaced
            found[pid] = Found(pid, seen.ticks, seen.name, _cmdline(pid), how, service)
            self._known[pid] = seen.ticks
            return True

        leaders: dict[int, tuple[int, str, _Started | None]] = {}
        """Session or group id to (leader's start ticks, who it is, its service)."""
        # Leaks first: a process reachable both ways is blamed, not excused.
        for started in sorted(self._started, key=lambda s: s.service):
            owner = started if started.service else None
            if started.ticks is None:
                continue
            add(started.pid, "started by the test" + (" as a service" if owner else ""),
                owner, started.ticks)
            if started.session:
                head = snap.get(started.pid)
                if head is None or head.ticks == started.ticks:  # not a reused PID
                    leaders[started.pid] = (started.ticks, "which the janitor started",
                                            owner)
        for pid, ticks in self._adopted:
            add(pid, "adopted by the test", None, ticks)
        for seen in snap.values():
            if seen.ppid == self._me and (seen.pid, seen.ticks) not in self._children_before:
                add(seen.pid, "a child of the test process, not started by the janitor", None)
        kids: dict[int, list[int]] = {}
        for seen in snap.values():
            kids.setdefault(seen.ppid, []).append(seen.pid)
        grown = True
        while grown:
            grown = False
            frontier = list(found.values())
            while frontier:
                parent = frontier.pop()
                leaders.setdefault(parent.pid, (parent.ticks, f"led by {parent.pid}",
                                                parent.service))
                for child in kids.get(parent.pid, ()):
                    if add(child, f"child of {parent.pid}", parent.service):
                        frontier.append(found[child])
            for seen in snap.values():
                if seen.pid in found:
                    continue
                for key, what in ((seen.sid, "session"), (seen.pgid, "process group")):
                    led = leaders.get(key)
                    if key in self._own_keys or led is None or seen.ticks < led[0]:
                        continue
                    if add(seen.pid, f"in {what} {key} {led[1]}", led[2]):
                        grown = True
                        break
        return found

    def leftovers(self, among: Iterable[int] | None = None) -> list[Found]:
        """Live processes this janitor is responsible for (services included); with
        ``among``, only those of these PIDs (without reading the rest of ``/proc``)."""
        if among is None:
            return list(self._find(_scan()).values())
        snap = {pid: seen for pid in among if (seen := _read_stat(pid)) is not None}
        return list(self._find(snap).values())

    # Ending.

    def close(self) -> None:
        """End whatever is left (leaks, then services, then what they left), reap the test's
        children, check the runtime directories; every problem goes to ``problems``."""
        for started in self._started:
            started.proc.poll()  # reaps the zombies of our own children
        found = self._find(_scan())
        self._end([f for f in found.values() if f.service is None], "left running")
        self._stop_services([s for s in self._started
                             if s.service and not s.judged and s.proc.poll() is None])
        for _ in range(10):
            for started in self._started:
                started.proc.poll()
            rest = list(self._find(_scan()).values())
            if not rest:
                break
            self._end(rest, "still running after the services stopped", grace_s=0.0)
        for started in self._started:
            try:
                started.proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                self.problems.append(f"could not be ended: pid {started.pid} `{_args(started)}`")
                with contextlib.suppress(OSError):
                    started.proc.kill()
        self._check_runtime_files()

    def _end(self, procs: Iterable[Found], what: str, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM (SIGKILL with no grace) each process not already ending and report it;
        SIGKILL what is left after ``grace_s``."""
        handles: list[_Handle] = []
        for found in procs:
            handle = _hold(found)
            if handle is None:
                continue
            seen = _read_stat(found.pid)
            handle.blamed = seen is not None and not _ending(found.pid, seen)
            if handle.blamed:
                _signal(handle, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
                _signal(handle, signal.SIGCONT)
            handles.append(handle)
        _wait(handles, grace_s)
        for handle in handles:
            if not handle.ended:
                handle.killed = True
                _signal(handle, signal.SIGKILL)
        _wait(handles, TERM_GRACE_S)
        for handle in handles:
            os.close(handle.fd)
            if not handle.blamed:
                continue
            if grace_s <= 0:
                fate = "SIGKILLed"
            elif handle.killed:
                fate = f"SIGKILLed, still running {grace_s:g} s after SIGTERM"
            else:
                fate = "ended on SIGTERM"
            if not handle.ended:
                fate = "could not be ended"
            owner = handle.found.service
            by = f" (of service pid {owner.pid})" if owner is not None else ""
            self.problems.append(f"{what}{by}: {handle.found.describe()}: {fate}")

    def _stop_services(self, services: list[_Started]) -> None:
        """Stop the services one at a time, the last started first (what started later may
        talk to what started before it, as an engine to its coordinator): SIGTERM, then each
        must exit with its code within its bound."""
        for started in reversed(services):
            started.judged = True
            if started.ticks is None or started.proc.poll() is not None:
                continue  # ended on its own meanwhile: nothing to stop
            found = Found(started.pid, started.ticks, "", _cmdline(started.pid),
                          "started by the test as a service", started)
            handle = _hold(found)
            if handle is None:
                continue
            name = f"service pid {started.pid} `{_args(started)}`"
            _signal(handle, signal.SIGTERM)
            _wait([handle], started.stop_within_s)
            os.close(handle.fd)
            if not handle.ended:
                self.problems.append(
                    f"{name}: still running {started.stop_within_s:g} s after SIGTERM, "
                    "SIGKILLed")
                with contextlib.suppress(OSError):
                    started.proc.kill()
            try:
                code = started.proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                continue  # reported as a process that could not be ended
            if handle.ended and code != started.exit_code:
                self.problems.append(
                    f"{name}: exited {_code(code)} on SIGTERM, expected "
                    f"{_code(started.exit_code)}")

    def _check_runtime_files(self) -> None:
        """What the test's processes left in their runtime directories (then removed)."""
        private = self.runtime_dir
        for name in sorted(_entries(private)):
            self._runtime_problem(private / name, "left in the test's runtime directory")
        shutil.rmtree(private, ignore_errors=True)
        for directory in sorted(self._runtime_dirs - {private}):
            before = self._before.get(directory, {})
            for name, ident in sorted(_entries(directory).items()):
                if before.get(name) == ident or not name.startswith(RUNTIME_PREFIX):
                    continue
                pid = _pid_in(name)
                if pid is None or (pid not in self._known and pid != self._me):
                    continue
                path = directory / name
                self._runtime_problem(path, "left in the runtime directory")
                with contextlib.suppress(OSError):
                    if pid != self._me and stat.S_ISFIFO(path.lstat().st_mode):
                        path.unlink()

    def _runtime_problem(self, path: Path, what: str) -> None:
        if path in self._reported:
            return
        self._reported.add(path)
        pid = _pid_in(path.name)
        owner = next((s for s in self._started if s.pid == pid), None)
        by = f" (made by pid {pid} `{_args(owner)}`)" if owner is not None else ""
        self.problems.append(f"{what}: {path}{by}")

    def check(self) -> None:
        """Raise when ``close()`` had to end anything, or found anything wrong (each problem
        is raised once)."""
        problems, self.problems = self.problems, []
        if problems:
            raise LeftBehind(problems)

    def assert_clean(self) -> None:
        """``close()`` then ``check()`` now, in the test's body: for a test that wants what
        was left behind to fail the test itself (a strict xfail only sees the body)."""
        self.close()
        self.check()


class LeftBehind(AssertionError):
    """The test left processes or runtime files behind, or a service did not stop."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the janitor had to clean up after the test ({len(self.problems)} "
                         f"problem{'s' if len(self.problems) != 1 else ''}):\n{lines}")


def _entries(directory: Path) -> dict[str, tuple[int, int]]:
    """Entries of ``directory`` with their identity (inode, change time)."""
    out: dict[str, tuple[int, int]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        with contextlib.suppress(OSError):
            st = os.lstat(directory / name)
            out[name] = (st.st_ino, st.st_ctime_ns)
    return out


def _pid_in(name: str) -> int | None:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _args(started: _Started) -> str:
    args = started.proc.args
    text = " ".join(map(str, args)) if isinstance(args, list | tuple) else str(args)
    return text if len(text) <= _CMDLINE_SHOWN else text[:_CMDLINE_SHOWN] + "..."


def _code(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


def _hold(found: Found) -> _Handle | None:
    """A pidfd on ``found``, if that very process (PID and start time) is still there."""
    try:
        fd = os.pidfd_open(found.pid)
    except OSError:
        return None
    seen = _read_stat(found.pid)
    if seen is None or seen.ticks != found.ticks:
        os.close(fd)
        return None
    return _Handle(found, fd, ended=seen.zombie)


def _signal(handle: _Handle, sig: int) -> None:
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(handle.fd, sig)


def _wait(handles: Sequence[_Handle], timeout_s: float) -> None:
    """Until every process has exited (its pidfd is readable) or ``timeout_s`` passed."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        waiting = {h.fd: h for h in handles if not h.ended}
        if not waiting:
            return
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        for fd, _ in poller.poll(left_ms):
            waiting[fd].ended = True
        if time.monotonic() >= deadline:
            return


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.01,
) -> Any:
    """Return the first truthy value of ``predicate()``; fail with ``what`` after ``timeout``.

    This is the one place tests wait for something that offers no event to block on (a file
    written by another process, a port being bound). The timeout only bounds failure; a
    passing test never waits for it.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def iter_tree(pid: int) -> Iterator[psutil.Process]:
    """The process and its live descendants."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    yield root
    try:
        yield from root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
