"""A real engine as a container's main process under each init, stopped as podman stops a
container, every process's signals and end from the kernel.

    python -m tests.init.real_containers vllm|sglang [--inits ...]     prints the table

The container (``tests.init.containers``: podman on runc, the engine base with Debian's tini,
the engine's virtualenv and the repository mounted read-only, the host's network) runs the
init as its PID 1 with the engine's command (``tests.init.real_engines``: the tiny model,
dummy weights, the CPU). Once the engine serves, ``strace`` on the host attaches to every
process of the container's PID namespace (``-f``: and to all they start), so each one's
record is the kernel's: the signals it received and who sent each (``si_pid`` in its own
namespace; 0 is a sender outside it: the runtime), the signal-sending calls it made, and
``exited with N`` or ``killed by SIG…``. strace is nobody's parent there and changes no
signal's effect; it slows every traced system call, as on the host. One stream is in flight
when ``podman stop -t GRACE`` comes (SIGTERM to PID 1, SIGKILL GRACE seconds later); alone it
ends well inside the grace period. Also measured: the exit code podman records, the zombies
in the namespace just before the stop and any that stayed unreaped a second or more during
it, the stream as the client received it, ``run``'s own summary (its log, ``podman logs``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.routers import free_port
from tests.engines.tiny_model import write_tiny_model
from tests.init.containers import (
    INIT_LABEL,
    mounts,
    namespace_pids,
    namespace_states,
    remove,
)
from tests.init.real_engines import (
    COMMANDS,
    ENGINES,
    GRACE_S,
    START_S,
    TRACED,
    Stream,
    Traced,
    parse_strace,
    read_stream,
    run_flags,
)
from tests.init.wrapper import read_run_log
from tests.pods.images import ENGINE_BASE, ENGINE_BASE_PACKAGES, Images, python_home
from tests.pods.podman import Podman

VENV_BIN = Path(sys.executable).parent
INITS: dict[str, Callable[[list[str], list[str]], list[str]]] = {
    "run": lambda engine, flags: [sys.executable, "-m", "coordinator", "run", *flags, "--",
                                  *engine],
    "tini": lambda engine, _f: ["tini", "--", *engine],
    "tini -g": lambda engine, _f: ["tini", "-g", "--", *engine],
    "dumb-init": lambda engine, _f: [str(VENV_BIN / "dumb-init"), *engine],
    "no init": lambda engine, _f: engine,
}
"""How each init is the container's command around the engine's (PID 1: tini needs no
``-s``)."""
SHM = "1g"
"""``/dev/shm``: vLLM's message queues take 160 MiB of it; podman's default is 64 MiB."""
COMMAND_SLACK_S = 120.0
ATTACH_S = 120.0
UNREAPED_S = 1.0
"""A zombie seen this long during the stop is one nobody reaps."""


@dataclass(frozen=True)
class Seen:
    """One process of the container, as the host saw it before the stop."""

    host_pid: int
    pid: int
    """Its PID in the container's namespace."""
    name: str
    threads: tuple[int, ...] = ()
    """Its threads' host IDs: a signal sent to the process is told on the thread that took
    it."""


def namespace(pid1: int) -> dict[int, Seen]:
    """Every process in ``pid1``'s PID namespace, by host PID: its PID there (``NSpid``) and
    its name (the title an engine set, else its command's)."""
    found = {}
    for entry in namespace_pids(pid1):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)
        if nspid is None:
            continue
        first = argv[0].decode(errors="replace") if argv and argv[0] else ""
        name = first if "::" in first else (Path(first.split(" ")[0]).name or "?")
        try:
            threads = tuple(int(t) for t in os.listdir(f"/proc/{entry}/task"))
        except OSError:
            threads = ()
        found[int(entry)] = Seen(int(entry), int(nspid.group(1).split()[-1]), name[:24],
                                 threads)
    return found


def merged(seen: Seen, traced: dict[int, Traced]) -> Traced:
    """The process's record: what its threads received and sent, its leader's end."""
    whole = Traced(seen.host_pid, end=traced.get(seen.host_pid, Traced(0)).end)
    for tid in dict.fromkeys((seen.host_pid, *seen.threads)):
        part = traced.get(tid)
        if part is not None:
            whole.received += part.received
            whole.sent += part.sent
    return whole


class Zombies:
    """Samples the namespace's process states during the stop: which were zombies, for how
    long, and whose child each was."""

    def __init__(self, pid1: int) -> None:
        self.pid1 = pid1
        self.first_seen: dict[int, float] = {}
        self.last_seen: dict[int, float] = {}
        self.parents: dict[int, set[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> dict[int, int]:
        """Each zombie now: its parent's host PID."""
        states = namespace_states(self.pid1)
        return {pid: parent for pid, (state, parent) in states.items() if state == "Z"}

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            at = time.monotonic()
            for pid, parent in self.now().items():
                self.first_seen.setdefault(pid, at)
                self.last_seen[pid] = at
                self.parents.setdefault(pid, set()).add(parent)

    def __enter__(self) -> Zombies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def unreaped(self) -> list[int]:
        """Zombies seen for ``UNREAPED_S`` or more: the engine's own (a parent that reaps
        its SIGKILLed children only as it exits), or PID 1's."""
        return [pid for pid, at in self.first_seen.items()
                if self.last_seen[pid] - at >= UNREAPED_S]

    def left_by(self, parent: int) -> list[int]:
        """Those of ``unreaped`` that were ``parent``'s children (PID 1: the init's to
        reap)."""
        return [pid for pid in self.unreaped() if parent in self.parents[pid]]


@dataclass
class Row:
    init: str
    exit_code: int
    """What podman records."""
    processes: dict[int, tuple[Seen, Traced]]
    """Host PID → (the process before the stop, what the kernel said)."""
    init_pid: int
    main_pid: int
    """Host PIDs: the container's PID 1, the engine's main process (PID 1 under no init)."""
    zombies_before: int
    zombies_unreaped: int
    zombies_of_pid1: int
    """Of ``zombies_unreaped``, the children of PID 1: those the init left unreaped."""
    stream: str
    stop_s: float
    log: str
    summary: dict[str, Any] | None = None
    reported: dict[int, dict[str, Any]] = field(default_factory=dict)
    """``run``'s own line for each process it ended, by its PID in the container."""

    def by_ns_pid(self, pid: int | None) -> Seen | None:
        return next((seen for seen, _ in self.processes.values() if seen.pid == pid), None)

    def sender(self, pid: int | None) -> str:
        if pid is None:
            return "the kernel"
        if pid == 0:
            return "the runtime"
        # The kernel gives the sender's PID in the receiver's namespace; a host PID is kept
        # in case a tracer outside is told its own.
        seen = self.by_ns_pid(pid) or (self.processes[pid][0] if pid in self.processes
                                       else None)
        if seen is None:
            return f"PID {pid}"
        if seen.host_pid == self.init_pid and self.init != "no init":
            return self.init.split(" ")[0]
        return "main" if seen.host_pid == self.main_pid else seen.name

    def label(self, seen: Seen) -> str:
        if seen.host_pid == self.init_pid and self.init != "no init":
            return f"{self.init.split(' ')[0]} (PID 1)"
        main = " (main" + (", PID 1)" if seen.host_pid == self.init_pid else ")")
        return seen.name + (main if seen.host_pid == self.main_pid else "")

    def killer(self, seen: Seen) -> str:
        """Who SIGKILLed ``seen`` (a SIGKILL is never seen received: its ``kill`` call is),
        or that none of the container's processes did: the kernel, which SIGKILLs what is
        left in a PID namespace when its PID 1 ends, or the runtime."""
        for other, traced in self.processes.values():
            if any(sig == "SIGKILL" and target == str(seen.pid)
                   for call, target, sig in traced.sent if call == "kill"):
                return self.sender(other.pid)
        return "no process in it"

    def fates(self) -> str:
        parts = []
        for seen, traced in sorted(self.processes.values(), key=lambda p: p[0].pid):
            got = sorted({f"{sig} from {self.sender(sender)}" for sig, sender in traced.received
                          if sig != "SIGCHLD"})
            end = traced.end or "not seen to end"
            if end == "killed by SIGKILL":
                end += f" (sender: {self.killer(seen)})"
            parts.append(f"{self.label(seen)}: {', '.join(got) or 'no signal'} → {end}")
        return "; ".join(parts)

    def init_sent(self) -> str:
        """What PID 1 sent when it is an init: the process-group calls as called, the rest
        by who received it."""
        if self.init == "no init":
            return "-"
        init = self.processes[self.init_pid][1]
        grouped = [f"{sig} to group {target}" for _, target, sig in init.sent
                   if target.startswith("-")]
        ns_pid = self.processes[self.init_pid][0].pid
        # A SIGKILL is never seen received (no one can catch it): its call says it.
        each = grouped or [f"{sig} to {self.label(seen)}"
                           for seen, traced in self.processes.values()
                           for sig, sender in traced.received
                           if sender in (ns_pid, self.init_pid) and sig != "SIGCHLD"]
        killed = [f"SIGKILL by {call}({target})" for call, target, sig in init.sent
                  if sig == "SIGKILL" and not target.startswith("-")]
        return ", ".join([*each, *killed]) or "nothing"

    def markdown(self) -> str:
        return (f"| {self.init} | {self.exit_code} | {self.init_sent()} | {self.fates()} "
                f"| {self.zombies_before} / {self.zombies_unreaped} ({self.zombies_of_pid1} "
                f"of PID 1) | {self.stream} "
                f"| {self.stop_s:.1f} s |")


HEADER = ("| init (PID 1) | exit code (podman) | the init sent | every process: signals "
          "received, from whom → its end (strace) | zombies: before the stop / one for 1 s "
          "or more during it (of them PID 1's) | the stream | podman stop took |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")


def _health(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _attach(pids: Sequence[int], trace: Path, errors: Path) -> subprocess.Popen[bytes]:
    """strace attached to ``pids`` and all they start; returns once it says each one is
    attached."""
    argv = ["strace", "-f", "-e", TRACED, "-o", str(trace)]
    for pid in pids:
        argv += ["-p", str(pid)]
    with errors.open("wb") as err:
        tracer = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err)
    deadline = time.monotonic() + ATTACH_S
    while True:
        said = errors.read_text(errors="replace")
        attached = {int(p) for p in re.findall(r"Process (\d+) attached", said)}
        if set(pids) <= attached:
            return tracer
        if tracer.poll() is not None or time.monotonic() > deadline:
            tracer.kill()
            tracer.wait()
            raise AssertionError(f"strace did not attach to {sorted(set(pids) - attached)}:"
                                 f"\n{said[-2000:]}")
        time.sleep(0.1)


def run_one(podman: Podman, images: Images, init: str, engine: str, model: Path,
            scratch: Path, grace_s: int = GRACE_S) -> Row:
    """1. Start the container: ``init`` as PID 1 with the engine's command; wait until the
       engine is healthy.
    2. Attach strace to every process in the container; open a stream; at its first token
       ``podman stop -t GRACE``.
    3. Collect: podman's exit code, every process's signals (and their senders) and end,
       the zombies, how the stream ended, ``run``'s summary."""
    scratch.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    venv = ENGINES / engine
    argv = INITS[init](COMMANDS[engine](model, port), run_flags(engine, scratch, port, grace_s))
    name = f"init-{engine}-{uuid.uuid4().hex[:8]}"
    image = images.base(ENGINE_BASE, ENGINE_BASE_PACKAGES)
    podman.run("run", "-d", "--name", name, *podman.labels(INIT_LABEL), "--network", "host",
               "--workdir", str(scratch), "--env", "OMP_NUM_THREADS=1", "--shm-size", SHM,
               *mounts(scratch, (venv, python_home(venv), model)), image, *argv)
    tracer = None
    try:
        pid1 = int(podman.inspect(name)["State"]["Pid"])
        deadline = time.monotonic() + START_S
        while not _health(url):
            if not podman.inspect(name)["State"]["Running"]:
                raise AssertionError(f"{init}: the container ended before the engine served:"
                                     f"\n{podman.run('logs', name, check=False).stderr[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{init}: the engine never became healthy")
            time.sleep(0.5)
        seen = namespace(pid1)
        (scratch / "namespace.json").write_text(json.dumps(
            {pid: dataclasses.asdict(one) for pid, one in seen.items()}))
        main_pid = pid1 if init == "no init" else min(
            p for p in seen if p != pid1 and _parent(p) == pid1)
        trace = scratch / "strace.log"
        tracer = _attach(sorted(seen), trace, scratch / "strace.err")
        stream = Stream()
        reader = threading.Thread(target=read_stream, args=(url, stream), daemon=True)
        reader.start()
        stream.first.wait(START_S)
        with Zombies(pid1) as zombies:
            before = len(zombies.now())
            started = time.monotonic()
            podman.run("stop", "-t", str(grace_s), name, timeout=grace_s + COMMAND_SLACK_S)
            stop_s = time.monotonic() - started
        reader.join(120)
        tracer.wait(timeout=120)
        exit_code = int(podman.inspect(name)["State"]["ExitCode"])
        log = podman.run("logs", name, check=False)
        text = log.stdout + log.stderr
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        remove(podman, name)
    traced = parse_strace(trace)
    row = Row(init, exit_code, {pid: (s, merged(s, traced)) for pid, s in seen.items()},
              pid1, main_pid, before, len(zombies.unreaped()), len(zombies.left_by(pid1)),
              stream.how, stop_s, text)
    if init == "run":
        run_log = read_run_log(text)
        row.summary, row.reported = run_log.summary, run_log.processes
    return row


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from tests.init.containers import unavailable as containers_unavailable
    from tests.init.real_engines import arguments, unavailable

    args = arguments(__doc__, list(INITS), argv)
    reason = unavailable(args.engine) or containers_unavailable()
    if reason:
        print(reason)
        return 1
    podman = Podman()
    podman.prepare()
    podman.remove_leftovers()
    images = Images(podman)
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.scratch or Path(temporary)
        model = write_tiny_model(scratch / "model")
        for init in args.inits:
            print(f"{init}: load average {os.getloadavg()[0]:.1f} at the start", flush=True)
            row = run_one(podman, images, init, args.engine, model,
                          scratch / init.replace(" ", "-"), args.grace)
            print(row.markdown(), flush=True)
            rows.append(row)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end\n{HEADER}")
    print("\n".join(row.markdown() for row in rows))
    podman.remove_leftovers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
