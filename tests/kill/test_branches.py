"""Kill engine paths the scenario tests do not take: joining and escalating runs, resumed
tiers, the deadline's sweeps, processes that vanish or change between a scan and their
admission, failures of the kernel interfaces, and the small guards of each module.

Processes are real wherever the path is about processes. The shapes the other tests' trees do
not have come from ``NODE`` (below), a small program run with ``python -c``; a failure of the
kernel that cannot be caused on purpose (a refused signal, an unreadable exit code, a pidfd
that cannot be opened) is put in with ``monkeypatch`` at the one call that fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.kill import (
    Fate,
    KillPolicy,
    ProcessOutcome,
    Target,
    Terminator,
    callers,
    membership,
    pidfd,
    procfs,
    safety,
    terminate,
)
from coordinator.kill.engine import KillRun
from coordinator.kill.process_exit import death_detail
from coordinator.kill.table import ProcessTable
from coordinator.kill.tiers import Member
from coordinator.kill.watch import POLL_INTERVAL_S, ExitWatcher
from coordinator.tier_settings import TierSyntaxError, tier_from_mapping
from tests.kill.helpers import alive, start_time, start_tree
from tests.support.processes import ProcessJanitor, wait_for

REPO = Path(__file__).resolve().parents[2]
SLEEPER = ["-c", "import time; time.sleep(120)"]
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
GENEROUS = KillPolicy(tier_timeout_s=20, deadline_s=60)

NODE = r"""
import json, os, signal, sys

spec, out = json.loads(sys.argv[1]), sys.argv[2]
BOUND_S = 120.0  # every process of this program ends by itself after this long
TERM, CHLD = signal.SIGTERM, signal.SIGCHLD
signal.pthread_sigmask(signal.SIG_BLOCK, {TERM, CHLD})


def wait_term():
    signal.sigtimedwait({TERM}, BOUND_S)
    os._exit(0)


def fork(body):
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def escape(new_session):
    # Double fork: the grandchild is reparented away (to init or a subreaper).
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        if new_session:
            os.setsid()
        pid = os.fork()
        if pid == 0:
            os.close(write_end)  # or the parent's read would wait for this one's exit
            wait_term()
        os.write(write_end, str(pid).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        pid = int(pipe.read())
    os.waitpid(middle, 0)
    return pid


def write(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


if spec.get("own_group"):
    os.setpgid(0, 0)
children = [fork(wait_term) for _ in range(spec.get("children", 0))]
zombie = None
if spec.get("zombie"):
    zombie = fork(lambda: None)
    os.waitid(os.P_PID, zombie, os.WEXITED | os.WNOWAIT)  # exited, and never reaped
daemons = [escape(True) for _ in range(spec.get("daemons", 0))]
orphans = [escape(False) for _ in range(spec.get("orphans", 0))]
write(out, {"pid": os.getpid(), "children": children, "zombie": zombie, "daemons": daemons,
            "orphans": orphans})
waited = {CHLD} if spec.get("ignore_term") else {TERM, CHLD}
while True:
    info = signal.sigtimedwait(waited, BOUND_S)
    if info is None:
        os._exit(1)
    if info.si_signo == CHLD:
        for pid in children:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        continue
    if spec.get("fork_on_term"):
        write(out + ".late", {"pid": fork(wait_term)})
    os._exit(0)
"""
"""A node: ``python -c NODE SPEC_JSON OUT``. SPEC keys (all optional): ``children`` (plain
forked children, reaped as they exit), ``zombie`` (one child that exits at once and is never
reaped), ``daemons`` (double fork and ``setsid``), ``orphans`` (double fork, same session),
``own_group`` (a process group of its own), ``ignore_term`` (only SIGKILL ends it),
``fork_on_term`` (on SIGTERM it forks a child, writes ``OUT.late`` and exits). Every process
waits for SIGTERM (blocked, ``sigtimedwait``) and exits 0 on it; the node writes ``OUT``
(``{"pid", "children", "zombie", "daemons", "orphans"}``) once all of them run."""


@dataclasses.dataclass
class Node:
    proc: subprocess.Popen[Any]
    out: Path
    info: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def target(self) -> Target:
        return Target(self.pid, start_time(self.pid))

    def late(self) -> int | None:
        """The child forked on SIGTERM (``fork_on_term``), once it was forked."""
        path = Path(f"{self.out}.late")
        return int(json.loads(path.read_text())["pid"]) if path.exists() else None


def start_node(janitor: ProcessJanitor, tmp_path: Path, spec: dict[str, Any], *,
               prefix: tuple[str, ...] = (), new_session: bool = True) -> Node:
    out = tmp_path / f"node-{len(list(tmp_path.glob('node-*.json')))}.json"
    proc = janitor.spawn([*prefix, sys.executable, "-c", NODE, json.dumps(spec), str(out)],
                         cwd=REPO, new_session=new_session)
    wait_for(lambda: out.exists() or proc.poll() is not None, what="the node up")
    assert out.exists(), f"the node exited {proc.returncode}"
    info = json.loads(out.read_text())
    for pid in info["daemons"] + info["orphans"]:  # outside the session: ended by pid
        janitor.adopt(pid)
    return Node(proc, out, info)


def ended(pid: int) -> bool:
    """Per /proc: ``pid`` is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2] in "ZX"


def by_pid(outcomes: list[ProcessOutcome]) -> dict[int, ProcessOutcome]:
    return {o.pid: o for o in outcomes}


def table_for(pid: int, *, use_pidfd: bool = True) -> ProcessTable:
    """A ``ProcessTable`` tracking the live process ``pid`` as its one root."""
    table = ProcessTable([Target(pid, start_time(pid))], protected=safety.protected_pids(),
                         use_pidfd=use_pidfd, on_update=None, prior=None,
                         started_at=time.time())
    table.add_roots()
    assert pid in table.live
    return table


# --- engine: joining, escalation, the deadline ---------------------------------------------


async def test_joining_calls_wait_and_a_force_call_escalates_the_running_kill(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root that only SIGKILL ends; a Terminator kill with a minute of tier timeout,
       until the root got its SIGTERM;
    2. a joining call with a graceful policy, then two joining calls in force mode;
    3. the tier's wait ends at once: the root is SIGKILLed (the detail says force mode), the
       report says it was escalated (once), and every call gets that one report."""
    node = start_node(janitor, tmp_path, {"ignore_term": True})
    terminator = Terminator()
    signalled = asyncio.Event()

    def update(o: ProcessOutcome) -> None:
        if o.signalled_at is not None:
            signalled.set()

    first = asyncio.ensure_future(terminator.run(
        [node.target], KillPolicy(tier_timeout_s=60, deadline_s=120), on_update=update))
    await asyncio.wait_for(signalled.wait(), 30)
    plain = asyncio.ensure_future(terminator.run([], KillPolicy(tier_timeout_s=0.01)))
    await asyncio.sleep(0)  # the graceful join reaches its wait
    assert terminator.running
    forced = [asyncio.ensure_future(terminator.run([], KillPolicy(force=True)))
              for _ in range(2)]
    reports = await asyncio.wait_for(asyncio.gather(first, plain, *forced), 30)
    report = reports[0]
    assert all(r is report for r in reports)
    assert report.mode == "force"
    assert report.notes.count("escalated to force mode while running: SIGKILL at once") == 1
    (outcome,) = report.processes
    assert (outcome.fate, outcome.exit_code, outcome.signal) == (Fate.KILLED, -9, "SIGTERM")
    assert outcome.detail == "force mode after SIGTERM: SIGKILL at once"
    assert node.proc.wait(timeout=30) == -signal.SIGKILL


async def test_an_escalation_as_the_tier_is_signalled_skips_its_wait(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root that only SIGKILL ends; a kill whose on_update escalates the run the moment
       the root is given its graceful signal (before the tier waits);
    2. the tier does not wait: the root is SIGKILLed right after its SIGTERM."""
    node = start_node(janitor, tmp_path, {"ignore_term": True})
    run: KillRun | None = None

    def update(o: ProcessOutcome) -> None:
        if o.signalled_at is not None and run is not None:
            run.escalate()

    run = KillRun([node.target], KillPolicy(tier_timeout_s=60, deadline_s=120), update)
    report = await asyncio.wait_for(run.run(), 30)
    (outcome,) = report.processes
    assert outcome.detail == "force mode after SIGTERM: SIGKILL at once"
    assert outcome.fate is Fate.KILLED
    assert report.mode == "force"


async def test_a_kernel_without_exit_info_is_noted(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. pidfds, but no PIDFD_INFO_EXIT (a kernel before 6.15);
    2. a kill says where exit codes come from and why non-children's may be unknown; the
       root, our child, still has its exit code."""
    monkeypatch.setattr(pidfd, "support",
                        lambda: pidfd.Support(True, False, "PIDFD_GET_INFO unavailable"))
    proc = janitor.spawn_python(SLEEPER)
    report = await terminate([Target(proc.pid, start_time(proc.pid))], GENEROUS)
    assert report.exit_codes_from == "waitid"
    assert ("exit codes of processes that are not our children are known only while they "
            "are zombies (PIDFD_GET_INFO unavailable)") in report.notes
    assert [o.exit_code for o in report.processes] == [-signal.SIGTERM]


async def test_tiers_without_time_are_sigkilled_without_a_graceful_signal(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root and a child; a kill whose tiers get no time (a zero tier timeout);
    2. each tier is SIGKILLed at once, no graceful signal sent, and the report says why."""
    node = start_node(janitor, tmp_path, {"children": 1})
    report = await terminate([node.target], KillPolicy(tier_timeout_s=0, deadline_s=30))
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted([node.pid, *node.info["children"]])
    for o in outcomes.values():
        assert (o.fate, o.signal, o.detail) == (Fate.KILLED, None,
                                                "no time left for a graceful exit")


async def test_past_the_deadline_new_processes_are_swept_three_times_at_most(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. a kill whose deadline has passed when it starts, and a discovery that finds one new
       real process at every scan (a fork loop the kill cannot get ahead of);
    2. every process found is SIGKILLed as found after the deadline, and after the third such
       sweep the kill stops scanning: three processes were found, all of them SIGKILLed."""
    root = janitor.spawn_python(SLEEPER)
    born: list[subprocess.Popen[Any]] = []

    def one_more(self: ProcessTable) -> list[int]:
        proc = janitor.spawn_python(SLEEPER)
        born.append(proc)
        stat = procfs.read_stat(proc.pid)
        assert stat is not None
        member = Member(proc.pid, root.pid, 1, stat.name, "", None, root.pid)
        assert self._admit(proc.pid, member, boot=procfs.boot_time(),
                           expected_ticks=stat.start_ticks) is not None
        return [proc.pid]

    monkeypatch.setattr(ProcessTable, "discover", one_more)
    report = await terminate([Target(root.pid, start_time(root.pid))],
                             KillPolicy(deadline_s=0, confirm_s=5))
    assert len(born) == 3
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted([root.pid, *(p.pid for p in born)])
    for o in outcomes.values():
        assert (o.tier, o.detail, o.signal) == ("deadline", "found after the deadline", None)
        assert o.killed_at is not None
    for proc in [root, *born]:
        assert proc.wait(timeout=30) == -signal.SIGKILL


# --- engine: resuming a previous run's tiers -------------------------------------------------


async def test_resumed_tiers_sigkill_again_wait_out_the_rest_and_find_late_forks(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root (forks a child on SIGTERM) and its child; a previous run had SIGKILLed the
       child and SIGTERMed the root (given as ``prior``, though neither got it yet);
    2. the resumed kill SIGKILLs the child again (its first kill time kept); as it does, the
       root is given the SIGTERM of that previous run, forks and exits; its tier's wait ends;
    3. nothing is left unsignalled, but a new scan finds the forked process (in the root's
       session): it gets a tier of its own and exits on SIGTERM."""
    node = start_node(janitor, tmp_path, {"children": 1, "fork_on_term": True})
    (child,) = node.info["children"]
    now = time.time()
    prior = {
        (child, start_time(child)): ProcessOutcome(
            pid=child, name="python", start_time=start_time(child), depth=1, tier="depth-1",
            signal="SIGTERM", signalled_at=now - 1, killed_at=now - 0.5),
        (node.pid, start_time(node.pid)): ProcessOutcome(
            pid=node.pid, name="python", start_time=start_time(node.pid), tier="roots",
            signal="SIGTERM", signalled_at=now),
    }
    sent = False

    def update(o: ProcessOutcome) -> None:
        nonlocal sent
        if o.detail == "SIGKILLed by a previous run" and not sent:
            sent = True
            os.kill(node.pid, signal.SIGTERM)  # what the previous run had sent

    report = await terminate([node.target], GENEROUS, prior=prior, on_update=update)
    late = node.late()
    assert late is not None
    janitor.adopt(late)
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted([node.pid, child, late])
    assert (outcomes[child].fate, outcomes[child].detail) == (Fate.KILLED,
                                                              "SIGKILLed by a previous run")
    assert outcomes[child].killed_at == now - 0.5
    assert (outcomes[node.pid].fate, outcomes[node.pid].exit_code) == (Fate.EXITED, 0)
    assert outcomes[node.pid].signalled_at == now
    forked = outcomes[late]
    assert (forked.fate, forked.signal, forked.tier) == (Fate.EXITED, "SIGTERM", "depth-2")
    assert f"in the session its process {node.pid} leads" in forked.detail
    assert "resumed 2 process(es) signalled by a previous run" in report.notes


async def test_a_process_that_exits_before_its_tier_is_settled_as_such(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree: root, two children, one with a child of its own; as that grandchild (the
       first tier) is signalled, the other child is ended by someone else;
    2. that child is reported exited before it was signalled, and its tier does not signal
       it; every other process is signalled and exits."""
    tree = start_tree(janitor, {"children": [{"role": "a", "children": [{"role": "g"}]},
                                             {"role": "b"}]}, tmp_path)
    (grandchild,) = tree.pids("g")
    (other,) = tree.pids("b")

    def update(o: ProcessOutcome) -> None:
        if o.pid == grandchild and o.signalled_at is not None and not ended(other):
            os.kill(other, signal.SIGTERM)
            wait_for(lambda: ended(other), what="the other child ended")

    report = await terminate([Target(tree.pid, start_time(tree.pid))], GENEROUS,
                             on_update=update)
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted(tree.pids())
    assert (outcomes[other].fate, outcomes[other].signal) == (Fate.EXITED, None)
    assert outcomes[other].detail == "exited before it was signalled"
    assert outcomes[other].elapsed_ms is None
    assert all(o.fate is Fate.EXITED and o.signal == "SIGTERM"
               for pid, o in outcomes.items() if pid != other)


async def test_a_resumed_process_past_its_tier_is_sigkilled_without_a_wait(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root that only SIGKILL ends, SIGTERMed by a previous run long past its tier's
       timeout; 2. the resumed kill does not wait at all: SIGKILL, keeping the first signal."""
    node = start_node(janitor, tmp_path, {"ignore_term": True})
    os.kill(node.pid, signal.SIGTERM)
    signalled_at = time.time() - 100
    prior = {(node.pid, start_time(node.pid)): ProcessOutcome(
        pid=node.pid, name="python", start_time=start_time(node.pid), tier="roots",
        signal="SIGTERM", signalled_at=signalled_at)}
    report = await terminate([node.target], KillPolicy(tier_timeout_s=5, deadline_s=30),
                             prior=prior)
    (outcome,) = report.processes
    assert (outcome.fate, outcome.detail) == (Fate.KILLED, "outlived its tier across a restart")
    assert outcome.signalled_at == signalled_at


async def test_prior_outcomes_apply_only_to_the_same_process_and_settle_by_what_was_sent(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root and its child; prior outcomes for the root's PID with another start time and
       with none, for the child with its role, and for three gone processes (already final;
       SIGKILLed; never signalled);
    2. the root is killed as if no prior were given; the child takes its prior role;
    3. every prior outcome of a process not found is reported, settled: final stays final,
       SIGKILLed is ``killed``, signalled is ``exited``, never signalled is ``gone``."""
    node = start_node(janitor, tmp_path, {"children": 1})
    (child,) = node.info["children"]
    root_start, child_start = start_time(node.pid), start_time(child)

    def gone(pid: int, **fields: Any) -> ProcessOutcome:
        return ProcessOutcome(pid=pid, name="old", start_time=1.0, **fields)

    stale = ProcessOutcome(pid=node.pid, name="python", start_time=root_start - 5,
                           signal="SIGTERM", signalled_at=time.time() - 10)
    unknown_start = ProcessOutcome(pid=node.pid, name="python", start_time=None)
    prior: dict[tuple[int, float | None], ProcessOutcome] = {
        (node.pid, root_start - 5): stale,
        (node.pid, None): unknown_start,
        (child, child_start): ProcessOutcome(pid=child, name="python", start_time=child_start,
                                             depth=1, role="scheduler"),
        (PID_MAX + 3, 1.0): gone(PID_MAX + 3, fate=Fate.SURVIVED, detail="as it was"),
        (PID_MAX + 4, 1.0): gone(PID_MAX + 4, killed_at=2.0),
        (PID_MAX + 5, 1.0): gone(PID_MAX + 5),
    }
    report = await terminate([node.target], GENEROUS, prior=prior)
    starts = {node.pid: root_start, child: child_start}
    live = [o for o in report.processes if o.start_time is not None and o.pid in starts
            and procfs.same_start(o.start_time, starts[o.pid])]
    assert {o.pid: (o.fate, o.signal) for o in live} == {node.pid: (Fate.EXITED, "SIGTERM"),
                                                        child: (Fate.EXITED, "SIGTERM")}
    assert by_pid(live)[child].role == "scheduler"
    settled = {(o.pid, o.start_time): (o.fate, o.detail) for o in report.processes
               if o not in live}
    watching = "ended while no coordinator was watching it"
    assert settled == {
        (node.pid, root_start - 5): (Fate.EXITED, watching),
        (node.pid, None): (Fate.GONE, watching),
        (PID_MAX + 3, 1.0): (Fate.SURVIVED, "as it was"),
        (PID_MAX + 4, 1.0): (Fate.KILLED, watching),
        (PID_MAX + 5, 1.0): (Fate.GONE, watching),
    }


# --- discovery and admission -----------------------------------------------------------------


async def test_a_zombie_child_is_reported_gone_with_its_exit_code(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root with a child that exited and was never reaped (a zombie);
    2. the kill reports the zombie ``gone``, already exited when found, with its exit code
       (from /proc), and neither tracks nor signals it; the root exits 0."""
    node = start_node(janitor, tmp_path, {"zombie": True})
    zombie = node.info["zombie"]
    report = await terminate([node.target], GENEROUS)
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted([node.pid, zombie])
    assert (outcomes[zombie].fate, outcomes[zombie].exit_code) == (Fate.GONE, 0)
    assert outcomes[zombie].detail == "had already exited (a zombie) when found"
    assert outcomes[zombie].signalled_at is None
    assert (outcomes[node.pid].fate, outcomes[node.pid].exit_code) == (Fate.EXITED, 0)


async def test_a_child_gone_between_the_scan_and_its_admission_is_left_out(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root with two children; as the first child is admitted, the second is SIGKILLed
       and reaped (after the scan listed it);
    2. the second child is not in the report (nothing was left to track), the rest exited."""
    node = start_node(janitor, tmp_path, {"children": 2})
    children = node.info["children"]
    vanished: list[int] = []

    def update(o: ProcessOutcome) -> None:
        if o.pid in children and not vanished:
            other = next(c for c in children if c != o.pid)
            vanished.append(other)
            os.kill(other, signal.SIGKILL)
            wait_for(lambda: not os.path.exists(f"/proc/{other}"), what="the child reaped")

    report = await terminate([node.target], GENEROUS, on_update=update)
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted(set([node.pid, *children]) - set(vanished))
    assert {o.fate for o in outcomes.values()} == {Fate.EXITED}


async def test_a_child_whose_start_differs_from_the_scan_is_not_tracked(
    janitor: ProcessJanitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. a root and a child; every scan shows the child with other start ticks than /proc
       has at admission (its PID reused in between);
    2. the child is neither tracked nor signalled: only the root is in the report, and the
       child still runs after the kill."""
    node = start_node(janitor, tmp_path, {"children": 1})
    (child,) = node.info["children"]
    real_snapshot = procfs.snapshot

    def shifted() -> dict[int, procfs.ProcStat]:
        snap = real_snapshot()
        if child in snap:
            snap[child] = dataclasses.replace(snap[child], start_ticks=snap[child].start_ticks + 1)
        return snap

    monkeypatch.setattr(procfs, "snapshot", shifted)
    report = await terminate([node.target], GENEROUS)
    try:
        assert [o.pid for o in report.processes] == [node.pid]
        assert alive(child)
    finally:
        os.kill(child, signal.SIGTERM)
        wait_for(lambda: ended(child), what="the child ended")


async def test_a_target_in_our_own_process_group_does_not_lend_its_group(
    janitor: ProcessJanitor,
) -> None:
    """1. a target started in this process's session and process group;
    2. the kill ends it, and uses neither that group nor that session to find processes."""
    proc = janitor.spawn_python(SLEEPER, new_session=False)
    assert os.getpgid(proc.pid) == os.getpgid(0)
    report = await terminate([Target(proc.pid, start_time(proc.pid))], GENEROUS)
    assert [(o.pid, o.fate, o.exit_code) for o in report.processes] == [
        (proc.pid, Fate.EXITED, -signal.SIGTERM)]


async def test_a_process_born_into_a_tracked_group_during_the_kill_is_found(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root in a process group of its own, in this process's session (so the session
       tells nothing); on SIGTERM it forks a child and exits;
    2. the child, reparented away, is found through the root's group as born during the
       kill, signalled, and exits."""
    node = start_node(janitor, tmp_path, {"own_group": True, "fork_on_term": True},
                      new_session=False)
    assert os.getpgid(node.pid) == node.pid
    try:
        report = await terminate([node.target], GENEROUS)
    finally:
        late = node.late()
        if late is not None:
            janitor.adopt(late)
    assert late is not None
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted([node.pid, late])
    born = outcomes[late]
    assert born.detail.startswith("born during the kill, reparented away from its tree")
    assert (born.fate, born.signal, born.depth) == (Fate.EXITED, "SIGTERM", 1)


async def test_an_orphan_gone_before_its_admission_is_left_out(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root leading its session, with a child and two orphans (reparented away, still in
       the session); as the first orphan is admitted, the second is SIGKILLed;
    2. the first orphan is found through the session and exits on SIGTERM; the second is not
       tracked (at most reported gone)."""
    node = start_node(janitor, tmp_path, {"children": 1, "orphans": 2})
    orphans = node.info["orphans"]
    vanished: list[int] = []

    def update(o: ProcessOutcome) -> None:
        if o.pid in orphans and not vanished:
            other = next(p for p in orphans if p != o.pid)
            vanished.append(other)
            os.kill(other, signal.SIGKILL)
            wait_for(lambda: ended(other), what="the orphan ended")

    report = await terminate([node.target], GENEROUS, on_update=update)
    outcomes = by_pid(report.processes)
    (kept,) = set(orphans) - set(vanished)
    assert "in the session its process" in outcomes[kept].detail
    assert outcomes[kept].fate is Fate.EXITED
    assert vanished[0] not in outcomes or outcomes[vanished[0]].fate is Fate.GONE
    assert outcomes[node.pid].fate is Fate.EXITED


@pytest.fixture
def mount_namespace() -> tuple[str, ...]:
    """The prefix that starts a program in a mount namespace of its own (skips without)."""
    prefix = ("unshare", "-m", "--propagation", "private")
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if probe.returncode != 0:
        pytest.skip(f"unshare -m is not permitted here: {probe.stderr.strip()}")
    return prefix


async def test_unit_members_gone_before_their_placement_or_admission_are_left_out(
    janitor: ProcessJanitor, tmp_path: Path, mount_namespace: tuple[str, ...]
) -> None:
    """1. a root in a mount namespace of its own, with a child and two daemons there (their
       own sessions, reparented away); a bystander process elsewhere;
    2. as the child is admitted (after the scan), the bystander is ended and reaped, so its
       placement cannot be read any more; as the first daemon is admitted, the second one is
       SIGKILLed;
    3. the first daemon is found in the root's mount namespace and exits on SIGTERM; the
       second is not tracked (at most reported gone); the bystander is in no report."""
    bystander = janitor.spawn_python(SLEEPER)
    node = start_node(janitor, tmp_path, {"children": 1, "daemons": 2},
                      prefix=mount_namespace)
    (child,) = node.info["children"]
    daemons = node.info["daemons"]
    vanished: list[int] = []

    def update(o: ProcessOutcome) -> None:
        if o.pid == child and bystander.poll() is None:
            bystander.kill()
            bystander.wait(timeout=30)
        if o.pid in daemons and not vanished:
            other = next(p for p in daemons if p != o.pid)
            vanished.append(other)
            os.kill(other, signal.SIGKILL)
            wait_for(lambda: ended(other), what="the daemon ended")

    report = await terminate([node.target], GENEROUS, on_update=update)
    assert bystander.returncode == -signal.SIGKILL
    outcomes = by_pid(report.processes)
    (kept,) = set(daemons) - set(vanished)
    assert "left its tree (daemonized); found in the engine's mount namespace" in \
        outcomes[kept].detail
    assert outcomes[kept].fate is Fate.EXITED
    assert vanished[0] not in outcomes or outcomes[vanished[0]].fate is Fate.GONE
    assert bystander.pid not in outcomes


async def test_a_failing_membership_search_is_noted_once_and_the_kill_goes_on(
    janitor: ProcessJanitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. unit membership raises on every scan; 2. the tree still ends through ancestry, and
    one note (not one per scan) says membership was not used."""

    def broken(self: membership.Units, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no /proc today")

    monkeypatch.setattr(membership.Units, "search", broken)
    node = start_node(janitor, tmp_path, {"children": 1})
    report = await terminate([node.target], GENEROUS)
    assert {o.fate for o in report.processes} == {Fate.EXITED}
    assert len(report.processes) == 2
    note = "unit membership failed (RuntimeError: no /proc today): not used"
    assert report.notes.count(note) == 1


# --- acting on processes: pidfds that cannot be opened, signals that cannot be sent -----------


async def test_processes_whose_pidfd_cannot_be_opened_are_signalled_by_pid_and_polled(
    janitor: ProcessJanitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. pidfd_open fails for the root (ENOSYS) and both children (EMFILE);
    2. each failure is noted once, each process says it is signalled by PID and polled;
    3. the tree still ends gracefully, children first."""
    node = start_node(janitor, tmp_path, {"children": 2})
    children = node.info["children"]
    real_open = os.pidfd_open

    def pidfd_open(pid: int, flags: int = 0) -> int:
        if pid == node.pid:
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
        if pid in children:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
    report = await terminate([node.target], GENEROUS)
    limit = "file descriptor limit reached: some processes are polled, not pidfd-watched"
    failed = f"pidfd_open failed ({os.strerror(errno.ENOSYS)})"
    assert report.notes.count(limit) == 1
    assert report.notes.count(failed) == 1
    outcomes = by_pid(report.processes)
    assert outcomes[node.pid].detail == f"{failed}: signalled by PID and polled"
    for c in children:
        assert outcomes[c].detail == f"{limit}: signalled by PID and polled"
    assert {o.fate for o in outcomes.values()} == {Fate.EXITED}
    assert outcomes[node.pid].exit_code == 0
    assert all(outcomes[c].ended_at <= outcomes[node.pid].signalled_at  # type: ignore[operator]
               for c in children)


async def test_a_process_that_cannot_be_signalled_survives_and_says_why(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. every signal through a pidfd is refused (EPERM); 2. the kill records the refusal
    of SIGTERM and of SIGKILL, and reports the process ``survived``: it still runs."""
    proc = janitor.spawn_python(SLEEPER)

    def refused(fd: int, sig: int) -> bool:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(pidfd, "send_signal", refused)
    report = await terminate([Target(proc.pid, start_time(proc.pid))],
                             KillPolicy(tier_timeout_s=0.2, deadline_s=2, confirm_s=0.2))
    try:
        (outcome,) = report.processes
        assert outcome.fate is Fate.SURVIVED
        assert outcome.detail.endswith(
            f"; SIGKILL could not be sent: {os.strerror(errno.EPERM)}")
        assert not report.graceful
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_polling_fallback_does_not_signal_a_zombie_or_a_process_gone_after_its_check(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without pidfds a signal goes by PID after a /proc check:
    1. a process that has exited (a zombie) is not signalled;
    2. a process that passed the check and was reaped before the signal went out is not
       signalled either (ESRCH is no error)."""
    zombie = janitor.spawn_python(SLEEPER)
    table = table_for(zombie.pid, use_pidfd=False)
    zombie.kill()
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
    assert table.send(table.live[zombie.pid], signal.SIGTERM) is False

    racer = janitor.spawn_python(SLEEPER)
    table = table_for(racer.pid, use_pidfd=False)
    real_read = procfs.read_stat

    def checked_then_gone(pid: int) -> procfs.ProcStat | None:
        stat = real_read(pid)
        if pid == racer.pid:
            racer.kill()
            racer.wait(timeout=30)
        return stat

    monkeypatch.setattr(procfs, "read_stat", checked_then_gone)
    tracked = table.live[racer.pid]
    assert table.send(tracked, signal.SIGTERM) is False
    assert tracked.outcome.detail == ""
    assert racer.returncode == -signal.SIGKILL


def test_without_pidfds_a_pid_that_names_another_process_is_never_signalled(
    janitor: ProcessJanitor,
) -> None:
    """1. a tracked process, without pidfds; 2. its PID now names another start (as a reused
    PID would: the start ticks recorded at tracking differ from /proc's); 3. ``send`` refuses
    without signalling: SIGKILLed by the test afterwards, the process dies of that SIGKILL,
    not of a SIGTERM (whose default action would have ended it at once)."""
    proc = janitor.spawn_python(SLEEPER)
    table = table_for(proc.pid, use_pidfd=False)
    tracked = table.live[proc.pid]
    tracked.start_ticks += 1
    assert table.send(tracked, signal.SIGTERM) is False
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_an_exited_process_is_never_signalled_or_settled_twice(janitor: ProcessJanitor) -> None:
    """1. a tracked process gets its graceful signal and exits;
    2. a second graceful signal, a SIGKILL and a plain signal do nothing; a second exit
       event (and one for an unknown PID) changes nothing."""
    proc = janitor.spawn_python(SLEEPER)
    table = table_for(proc.pid)
    t = table.live[proc.pid]
    assert table.unsignalled() == [t]
    table.signal_graceful(t, signal.SIGTERM, "roots")
    first_signal = t.outcome.signalled_at
    assert proc.wait(timeout=30) == -signal.SIGTERM
    table.mark_exited(proc.pid)
    settled = dataclasses.replace(t.outcome)
    assert table.unsignalled() == []
    assert t.exited
    table.signal_graceful(t, signal.SIGINT, "again")
    table.sigkill(t, "again", "too late")
    assert table.send(t, signal.SIGTERM) is False
    table.mark_exited(proc.pid)
    table.mark_exited(PID_MAX + 1)
    assert t.outcome == settled
    assert (t.outcome.fate, t.outcome.signalled_at, t.outcome.killed_at) == (
        Fate.EXITED, first_signal, None)
    table.finish([])


async def test_an_exit_code_unreadable_at_exit_is_read_again_at_the_end(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. reading the exit code fails (EIO) the first time; 2. the kill still settles the
    process as exited, and its report has the exit code and what it means, read at the end."""
    proc = janitor.spawn_python(SLEEPER)
    real_exit_code = pidfd.exit_code
    calls: list[int] = []

    def flaky(fd: int, pid: int, start_ticks: int) -> int | None:
        calls.append(pid)
        if len(calls) == 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_exit_code(fd, pid, start_ticks)

    monkeypatch.setattr(pidfd, "exit_code", flaky)
    report = await terminate([Target(proc.pid, start_time(proc.pid))], GENEROUS)
    (outcome,) = report.processes
    assert len(calls) == 2
    assert (outcome.fate, outcome.exit_code) == (Fate.EXITED, -signal.SIGTERM)
    assert outcome.detail == "died of SIGTERM's default action: no handler ran, so no cleanup"


def test_death_detail_names_unknown_and_other_signals() -> None:
    def died(code: int, **fields: Any) -> str:
        return death_detail(ProcessOutcome(pid=2, name="x", exit_code=code, **fields))

    assert died(-40, signal="SIGTERM") == "died of signal 40"
    assert died(-signal.SIGSEGV, signal="SIGTERM") == "died of SIGSEGV"
    assert died(-signal.SIGTERM, signal="SIGTERM", killed_at=1.0) == "died of SIGTERM"
    assert died(-signal.SIGTERM, signal="SIGTERM") == (
        "died of SIGTERM's default action: no handler ran, so no cleanup")


# --- exit events -------------------------------------------------------------------------


async def test_a_pidfd_the_loop_cannot_watch_is_polled_and_an_exit_fires_once(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. watch a process through a descriptor epoll refuses (a regular file's);
    2. its exit is still seen (by polling), once; watched again afterwards, it does not fire
       again; waiting for it then returns at once, and a zero wait for a live process fails;
    3. closing the watcher with a live pidfd registered stops watching it."""
    proc = janitor.spawn_python(SLEEPER)
    ticks = procfs.read_stat(proc.pid).start_ticks  # type: ignore[union-attr]
    exits: list[int] = []
    watcher = ExitWatcher(exits.append, use_pidfd=True)
    with (tmp_path / "regular").open("w") as regular:
        watcher.watch(proc.pid, regular.fileno(), ticks)
    proc.kill()
    assert await watcher.wait({proc.pid}, 30)
    watcher.watch(proc.pid, None, ticks)
    await until_true(lambda: not watcher._polled, "the second watch polled")
    assert exits == [proc.pid]
    assert await watcher.wait({proc.pid}, 0)

    other = janitor.spawn_python(SLEEPER)
    other_ticks = procfs.read_stat(other.pid).start_ticks  # type: ignore[union-attr]
    fd = os.pidfd_open(other.pid)
    try:
        watcher.watch(other.pid, fd, other_ticks)
        assert not await watcher.wait({other.pid}, 0)
        watcher.close()
        other.kill()
        other.wait(timeout=30)
        assert select.select([fd], [], [], 30)[0] == [fd]
        await asyncio.sleep(POLL_INTERVAL_S)
        assert exits == [proc.pid]
    finally:
        os.close(fd)


async def until_true(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Let the loop run (it polls every ``POLL_INTERVAL_S``) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(POLL_INTERVAL_S)


async def test_polling_goes_on_when_proc_cannot_be_read_for_a_moment(
    janitor: ProcessJanitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. without pidfds, the first /proc read of the poller fails (EMFILE);
    2. the poller looks again next period and sees the exit."""
    proc = janitor.spawn_python(SLEEPER)
    ticks = procfs.read_stat(proc.pid).start_ticks  # type: ignore[union-attr]
    real_read = procfs.read_stat
    failed: list[int] = []

    def read_stat(pid: int) -> procfs.ProcStat | None:
        if not failed:
            failed.append(pid)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_read(pid)

    exits: list[int] = []
    watcher = ExitWatcher(exits.append, use_pidfd=False)
    monkeypatch.setattr(procfs, "read_stat", read_stat)
    watcher.watch(proc.pid, None, ticks)
    proc.kill()
    try:
        assert await watcher.wait({proc.pid}, 30)
    finally:
        watcher.close()
    assert failed == [proc.pid]
    assert exits == [proc.pid]


# --- pidfd, procfs, callers, membership, tier text: the kernel's and the text's corners -------


@pytest.fixture
def fresh_support() -> Iterator[None]:
    """``pidfd.support()`` is detected once per process: forget it around the test."""
    pidfd.support.cache_clear()
    yield
    pidfd.support.cache_clear()


def test_support_without_pidfds(fresh_support: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "pidfd_open")
    assert pidfd.support() == pidfd.Support(False, False, "this Python has no os.pidfd_open")


def test_support_when_pidfd_open_fails(
    fresh_support: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pidfd_open(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
    assert pidfd.support() == pidfd.Support(
        False, False, f"pidfd_open failed: {os.strerror(errno.ENOSYS)}")


def test_support_without_pidfd_get_info(
    fresh_support: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def get_info(fd: int, mask: int = pidfd.PIDFD_INFO_EXIT) -> pidfd.PidfdInfo:
        raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))

    monkeypatch.setattr(pidfd, "get_info", get_info)
    assert pidfd.support() == pidfd.Support(
        True, False, f"PIDFD_GET_INFO unavailable: {os.strerror(errno.ENOTTY)}")


@pytest.mark.parametrize("supported", [pidfd.PIDFD_INFO_PID | pidfd.PIDFD_INFO_EXIT,
                                       pidfd.PIDFD_INFO_PID])
def test_support_from_the_kernels_supported_mask(
    fresh_support: None, monkeypatch: pytest.MonkeyPatch, supported: int
) -> None:
    """A kernel that reports its supported mask (6.17+) is taken at its word."""
    info = pidfd.PidfdInfo(mask=pidfd.PIDFD_INFO_SUPPORTED_MASK, cgroupid=0, pid=1, tgid=1,
                           ppid=0, exit_status=None, supported_mask=supported)
    monkeypatch.setattr(pidfd, "get_info", lambda fd, mask=0: info)
    assert pidfd.support() == pidfd.Support(True, bool(supported & pidfd.PIDFD_INFO_EXIT),
                                            "PIDFD_GET_INFO reports its supported mask")


def test_an_unparsable_kernel_release_is_not_new_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, "custom-build", real.version,
                            real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    assert not pidfd._kernel_at_least(6, 15)


def test_pidfd_helpers_on_gone_processes_and_wrong_descriptors(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """``child_exit_code`` of PID 0 (EINVAL: no answer) and of a descriptor that is no pidfd
    (EBADF: raised); ``reaped_exit_code`` of a descriptor that is no pidfd (no answer)."""
    assert pidfd.child_exit_code(0, by_pid=True) is None
    with (tmp_path / "regular").open("w") as regular:
        with pytest.raises(OSError, match=os.strerror(errno.EBADF)) as raised:
            pidfd.child_exit_code(regular.fileno())
        assert raised.value.errno == errno.EBADF
        assert pidfd.reaped_exit_code(regular.fileno()) is None


def test_proc_files_that_are_missing_odd_or_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a /proc made for the test: no btime line, a stat that is a directory, a status
    without Tgid, a process without files, a socket table missing (no IPv6)."""
    (tmp_path / "stat").write_text("cpu  1 2 3\nctxt 5\n")
    (tmp_path / "7" / "stat").mkdir(parents=True)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "status").write_text("Name:\tx\nPid:\t8\n")
    (tmp_path / "self" / "net").mkdir(parents=True)
    (tmp_path / "self" / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
        "  timeout inode\n")
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    procfs.boot_time.cache_clear()  # read once per process: forget the real one
    with pytest.raises(RuntimeError, match="no btime line"):
        procfs.boot_time()
    assert procfs.read_stat(7) is None
    assert procfs.thread_group(8) is None
    assert procfs.cmdline(9) == ""
    assert callers.connections() == []
    assert callers.socket_inodes(9) == set()


def test_pure_corners_of_the_parsers() -> None:
    """A cycle in a parent map, a short /proc/net/tcp line, an empty PID list, a v1 cgroup
    line with an empty controller, a tier object whose signal is not a name."""
    stat = procfs.parse_stat("2 (x) S 1 2 2 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0")
    assert procfs.descendants(1, {1: stat}, {1: [2], 2: [1, 3]}) == [(2, 1), (3, 2)]
    assert callers.parse_net_tcp("header\n   0: 0100007F:1F90 00000000:0000 0A\n") == []
    assert callers.clients([]) == set()
    assert membership.parse_cgroup("3:,cpu:/x\n") == {"cpu": "/x"}
    with pytest.raises(TierSyntaxError, match="'signal' must be a name"):
        tier_from_mapping({"name": "a", "pattern": "x", "signal": 15})
