"""The ordered graceful kill against real process trees, real signals and real pidfds."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.errors import RefusedTarget
from coordinator.kill import (
    Fate,
    KillPolicy,
    ProcessOutcome,
    Target,
    Terminator,
    terminate,
)
from coordinator.kill.engine import KillRun
from coordinator.kill.policy import TierSpec
from tests.kill.helpers import alive, start_time, start_tree
from tests.support.processes import ProcessJanitor, wait_for

SLEEPER = ["-c", "import time; time.sleep(120)"]
BYSTANDER: dict[str, Any] = {"service": True, "exit_code": -signal.SIGTERM}
"""A sleeper the kill must leave alone: the janitor stops it at the end, and it must still
be there to die of that SIGTERM (its default action)."""
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
SLOW_TREE = {
    "teardown": 0.2,
    "children": [
        {"role": "scheduler", "pdeathsig": True, "teardown": 0.4,
         "children": [{"role": "tp-worker", "pdeathsig": True, "teardown": 0.3}]},
        {"role": "scheduler", "pdeathsig": True, "teardown": 0.4},
        {"role": "detokenizer", "pdeathsig": True, "teardown": 0.1},
    ],
}


def by_pid(outcomes: list[ProcessOutcome]) -> dict[int, ProcessOutcome]:
    return {o.pid: o for o in outcomes}


async def test_slow_teardown_tree_ends_children_first_and_cleanly(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree: root, two schedulers (one with a child), a detokenizer, all with
       PDEATHSIG=SIGKILL and seconds of cleanup; 2. terminate it with generous timeouts;
    3. every process exited gracefully and wrote its cleanup-finished marker (none was killed
       by its parent's death); 4. every child finished before its parent was signalled;
    5. the root exited 0."""
    tree = start_tree(janitor, SLOW_TREE, tmp_path)
    updates: list[tuple[int, str]] = []
    report = await terminate(
        [Target(tree.pid, start_time(tree.pid))],
        KillPolicy(tier_timeout_s=30, deadline_s=60),
        on_update=lambda o: updates.append((o.pid, o.fate.value)),
    )
    outcomes = by_pid(report.processes)
    assert sorted(outcomes) == sorted(tree.pids())
    assert all(o.fate is Fate.EXITED for o in outcomes.values()), report.to_dict()
    assert report.graceful
    assert report.exit_detection == "pidfd"
    markers = tree.markers()
    assert sorted(markers) == sorted(tree.pids())
    assert all(m["cleanup_finished"] for m in markers.values())
    for o in outcomes.values():
        if o.parent_pid in outcomes:
            parent_signalled = markers[o.parent_pid]["signalled_at"]
            assert markers[o.pid]["ended_at"] <= parent_signalled
    assert [outcomes[p].tier for p in tree.pids()] == ["roots", "depth-1", "depth-2",
                                                       "depth-1", "depth-1"]
    assert all(o.exit_code == 0 for o in outcomes.values())
    assert tree.root.wait(timeout=30) == 0
    assert (tree.pid, "running") in updates
    assert (tree.pid, "exited") in updates


async def test_sigterm_ignoring_child_is_killed_at_its_tier_timeout(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree whose child ignores SIGTERM; 2. terminate with a short tier timeout;
    3. the child is reported killed (exit code -SIGKILL); 4. the root still exits 0."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True},
                                             {"role": "fine", "exit_code": 3}]}, tmp_path)
    report = await terminate([Target(tree.pid)], KillPolicy(tier_timeout_s=0.5, deadline_s=20))
    outcomes = by_pid(report.processes)
    (stubborn,) = tree.pids("stubborn")
    (fine,) = tree.pids("fine")
    assert outcomes[stubborn].fate is Fate.KILLED
    assert outcomes[stubborn].exit_code == -signal.SIGKILL
    assert outcomes[stubborn].signal == "SIGTERM"
    assert outcomes[stubborn].killed_at is not None
    assert outcomes[fine].fate is Fate.EXITED
    assert outcomes[fine].exit_code == 3  # not our child: PIDFD_GET_INFO or /proc
    assert outcomes[tree.pid].fate is Fate.EXITED
    assert outcomes[tree.pid].exit_code == 0  # our child: waitid
    assert not report.graceful
    assert not alive(stubborn)


async def test_a_deadline_shorter_than_the_tier_timeout_cuts_the_wait(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a SIGTERM-ignoring child, tier timeout 300 s but deadline 2 s; 2. terminate;
    3. the kill ends with the child killed: it did not wait 300 s; 4. the root still got
    its SIGTERM and the time it needed (the last tier's reserve): it ran its cleanup and
    exited 0, by its own record and by its exit status."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True}]},
                      tmp_path)
    report = await terminate([Target(tree.pid)], KillPolicy(tier_timeout_s=300, deadline_s=2))
    outcomes = by_pid(report.processes)
    assert len(outcomes) == 2
    assert outcomes[tree.pids("stubborn")[0]].fate is Fate.KILLED
    root = outcomes[tree.pid]
    assert (root.fate, root.signal, root.killed_at) == (Fate.EXITED, "SIGTERM", None), root
    assert tree.root.wait(timeout=30) == 0
    assert sorted(tree.markers()) == [tree.pid]
    assert all(not alive(p) for p in tree.pids())


async def test_children_of_a_root_sigkilled_at_the_deadline_die_with_it_not_by_our_sigkill(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """SGLang's shape at the end of a budget: the main process first and alone
    (``include_root``), ignoring SIGTERM (serving a stream on), its children ending when it
    dies (``PR_SET_PDEATHSIG``): a detokenizer at once (SIGKILL), two schedulers a moment
    later (their death signal is SIGTERM and their cleanup takes 0.2 s, as the real SGLang's
    children took up to half a second to be gone after their main process's SIGKILL).

    1. terminate with a 5 s deadline: the root is SIGKILLed at the deadline less the reserve;
    2. no time is left for its children's tier: they get a moment to die with it first;
    3. their own records: each scheduler's cleanup ran and finished, started by its death
       signal after the root's SIGKILL; the kill sent them nothing (``killed_at`` and
       ``signal`` None, fate ``exited``, exit code 0), nor the detokenizer (-9, its
       PDEATHSIG), so the outcome can say they died with their main process. Sent our
       SIGKILL at once instead, the schedulers would have no record and exit -9."""
    spec = {"ignore_term": True, "children": [
        {"role": "scheduler", "pdeathsig": "SIGTERM", "teardown": 0.2},
        {"role": "scheduler", "pdeathsig": "SIGTERM", "teardown": 0.2},
        {"role": "detokenizer", "pdeathsig": True, "ignore_term": True}]}
    tree = start_tree(janitor, spec, tmp_path)
    root_first = TierSpec(name="main", roles=("worker",), include_root=True, timeout_s=300)
    report = await terminate([Target(tree.pid, tiers=(root_first,))],
                             KillPolicy(tier_timeout_s=10, deadline_s=5))
    outcomes = by_pid(report.processes)
    root = outcomes[tree.pid]
    assert (root.fate, root.tier, root.signal) == (Fate.KILLED, "main", "SIGTERM"), root
    assert root.killed_at is not None
    markers = tree.markers("scheduler")
    for pid in tree.pids("scheduler"):
        child = outcomes[pid]
        assert (child.fate, child.killed_at, child.signal) == (Fate.EXITED, None, None), child
        assert child.exit_code == 0, child
        assert markers[pid]["cleanup_finished"], markers
        assert markers[pid]["signalled_at"] >= root.killed_at, (markers[pid], root)
    (detokenizer,) = tree.pids("detokenizer")
    child = outcomes[detokenizer]
    assert (child.fate, child.killed_at, child.signal) == (Fate.EXITED, None, None), child
    assert child.exit_code in (-9, None), child
    assert all(not alive(p) for p in tree.pids())


async def test_processes_forked_during_shutdown_are_found_and_terminated(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree with two children that fork a new process on SIGTERM (one exits at once,
       orphaning its fork; one after a cleanup); 2. terminate; 3. both forks appear in the
       report and are no longer running."""
    spec = {"children": [{"role": "forker", "fork_on_term": True},
                         {"role": "forker", "fork_on_term": True, "teardown": 0.3}]}
    tree = start_tree(janitor, spec, tmp_path)
    report = await terminate([Target(tree.pid)], KillPolicy(tier_timeout_s=10, deadline_s=30))
    forks = tree.markers("forked")
    assert len(forks) == 2
    outcomes = by_pid(report.processes)
    for pid in forks:
        janitor.adopt(pid)
        assert pid in outcomes, report.to_dict()
        assert outcomes[pid].fate is Fate.EXITED
        assert not alive(pid)
    assert len(report.processes) == len(tree.pids()) + 2


async def test_a_target_inside_another_targets_tree_keeps_its_depth(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree root with a child with cleanup; 2. both given as targets (as adoption by
    pattern would); 3. the child is ended in its depth tier, before the root is signalled."""
    tree = start_tree(janitor, {"children": [{"role": "c", "teardown": 0.2}]}, tmp_path)
    (child,) = tree.pids("c")
    report = await terminate([Target(tree.pid), Target(child)], KillPolicy(deadline_s=30))
    outcomes = by_pid(report.processes)
    assert (outcomes[child].tier, outcomes[child].depth) == ("depth-1", 1)
    assert outcomes[child].root_pid == tree.pid
    markers = tree.markers()
    assert markers[child]["ended_at"] <= markers[tree.pid]["signalled_at"]


async def test_a_recycled_pid_is_reported_gone_and_left_alone(janitor: ProcessJanitor) -> None:
    """1. a live process; 2. a Target with its PID but another start time (a PID reused
    since registration); 3. reported gone; 4. the live process was never signalled."""
    proc = janitor.spawn_python(SLEEPER, **BYSTANDER)
    stale = Target(proc.pid, start_time=start_time(proc.pid) - 5.0)
    report = await terminate([stale], KillPolicy(deadline_s=5))
    (outcome,) = report.processes
    assert outcome.fate is Fate.GONE
    assert "start time" in outcome.detail
    assert outcome.signalled_at is None
    assert proc.poll() is None
    assert alive(proc.pid)


@pytest.mark.parametrize(
    "pid", [1, 0, -1, os.getpid(), os.getppid()], ids=["init", "zero", "group", "self", "parent"]
)
async def test_protected_targets_are_refused_before_anything_is_signalled(
    janitor: ProcessJanitor, pid: int
) -> None:
    """1. a live process and a protected PID in the same call; 2. terminate refuses with
    RefusedTarget; 3. the live process was not signalled."""
    proc = janitor.spawn_python(SLEEPER, **BYSTANDER)
    with pytest.raises(RefusedTarget) as refused:
        await terminate([Target(proc.pid), Target(pid)], KillPolicy(deadline_s=5))
    assert refused.value.pid == pid
    assert alive(proc.pid)


async def test_a_non_existent_pid_is_reported_gone() -> None:
    """1. a PID above pid_max; 2. terminate; 3. reported gone, nothing raised."""
    pid_max = PID_MAX
    report = await terminate([Target(pid_max + 1)], KillPolicy(deadline_s=5))
    assert [(o.pid, o.fate) for o in report.processes] == [(pid_max + 1, Fate.GONE)]
    assert report.graceful


async def test_a_second_concurrent_run_joins_the_first(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree with slow cleanup; 2. a Terminator.run call, and once it reported its first
    process, a second call with other targets and a tier timeout shorter than the cleanup;
    3. both get the same report; 4. the second call's arguments were ignored: the other
    process was left alone, and nothing was SIGKILLed (every process ran its cleanup, its
    own record says so)."""
    tree = start_tree(janitor, {"teardown": 0.3, "children": [{"teardown": 0.3}]}, tmp_path)
    other = janitor.spawn_python(SLEEPER, **BYSTANDER)
    terminator = Terminator()
    reported = asyncio.Event()
    first = asyncio.ensure_future(terminator.run(
        [Target(tree.pid)], KillPolicy(tier_timeout_s=30, deadline_s=60),
        on_update=lambda _: reported.set()))
    await asyncio.wait_for(reported.wait(), 30)
    assert terminator.running
    second = await terminator.run([Target(other.pid)],
                                  KillPolicy(tier_timeout_s=0.05, deadline_s=1))
    assert second is await first
    assert sorted(o.pid for o in second.processes) == sorted(tree.pids())
    assert {o.fate for o in second.processes} == {Fate.EXITED}
    assert sorted(tree.markers()) == sorted(tree.pids())
    assert alive(other.pid)
    assert not terminator.running


async def test_escalate_turns_the_running_kill_to_force_mode(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. nothing runs: ``escalate`` answers False; 2. a graceful kill of a tree whose child
    ignores SIGTERM, with a 60 s tier: once the child got its SIGTERM, ``escalate`` answers
    True; 3. the child is SIGKILLed at once, long before its tier would have ended, and so
    is the root after it (its wait status: -9, no cleanup record); the report says force
    mode."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True}]},
                      tmp_path)
    terminator = Terminator()
    assert terminator.escalate() is False
    signalled = asyncio.Event()
    stubborn = tree.pids("stubborn")[0]

    def seen(outcome: ProcessOutcome) -> None:
        if outcome.pid == stubborn and outcome.signalled_at is not None:
            signalled.set()

    run = asyncio.ensure_future(terminator.run(
        [Target(tree.pid)], KillPolicy(tier_timeout_s=60, deadline_s=120), on_update=seen))
    await asyncio.wait_for(signalled.wait(), 30)
    assert terminator.escalate() is True
    report = await asyncio.wait_for(run, 30)
    assert report.mode == "force"
    child = next(o for o in report.processes if o.pid == stubborn)
    assert child.fate is Fate.KILLED
    assert "force mode" in (child.detail or "")
    assert not alive(stubborn)
    assert tree.root.wait(timeout=30) == -signal.SIGKILL
    assert tree.markers() == {}
    assert terminator.escalate() is False


async def test_force_mode_sigkills_everything(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a tree with cleanup; 2. terminate in force mode; 3. every process killed, none ran
    its cleanup."""
    tree = start_tree(janitor, {"teardown": 5, "children": [{"teardown": 5, "children": [{}]}]},
                      tmp_path)
    report = await terminate([Target(tree.pid)], KillPolicy(force=True, deadline_s=10))
    assert report.mode == "force"
    assert {o.fate for o in report.processes} == {Fate.KILLED}
    assert {o.exit_code for o in report.processes} == {-signal.SIGKILL}
    assert all(o.signal is None for o in report.processes)
    assert tree.markers() == {}


async def test_a_restarted_run_does_not_signal_twice_and_keeps_the_tier_clock(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree whose child ignores SIGTERM; 2. a previous run had SIGTERMed the child 0.8 s
    ago with a 1 s tier timeout (given as ``prior``); 3. terminate with that prior and a long
    default timeout; 4. the child keeps its first signalled_at, and is killed because its
    tier's time ran out, not after a new full timeout."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True}]},
                      tmp_path)
    (child,) = tree.pids("stubborn")
    os.kill(child, signal.SIGTERM)
    signalled_at = time.time() - 0.8
    prior = {(child, start_time(child)): ProcessOutcome(
        pid=child, name="python", start_time=start_time(child), tier="depth-1",
        signal="SIGTERM", signalled_at=signalled_at)}
    report = await terminate(
        [Target(tree.pid)], KillPolicy(tier_timeout_s=1.0, deadline_s=600), prior=prior
    )
    outcome = by_pid(report.processes)[child]
    assert outcome.signalled_at == signalled_at
    assert outcome.fate is Fate.KILLED
    assert outcome.detail == "outlived its tier across a restart"
    assert by_pid(report.processes)[tree.pid].fate is Fate.EXITED
    assert any("resumed 1" in note for note in report.notes)


async def test_prior_outcomes_of_processes_no_longer_there_are_reported() -> None:
    """1. a prior record of a process that was signalled and is gone now; 2. terminate with
    a non-existent root; 3. the old record is settled as exited."""
    pid_max = PID_MAX
    prior = {(pid_max + 2, 1.0): ProcessOutcome(pid=pid_max + 2, name="old", start_time=1.0,
                                                signal="SIGTERM", signalled_at=2.0)}
    report = await terminate([Target(pid_max + 1)], KillPolicy(deadline_s=5), prior=prior)
    old = by_pid(report.processes)[pid_max + 2]
    assert old.fate is Fate.EXITED
    assert old.signalled_at == 2.0


async def test_polling_fallback_reports_itself(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a small tree whose root leaves its exited child a zombie until its own SIGTERM;
    2. a kill with pidfds switched off (as on a kernel without them);
    3. everything exited, the report says exits were polled, and both exit codes are known
       and true: the root's (the test's wait status) and the child's (from its zombie;
       what its parent reaped)."""
    tree = start_tree(janitor, {"reap": False, "children": [{"exit_code": 4}]}, tmp_path)
    run = KillRun([Target(tree.pid)], KillPolicy(deadline_s=30), use_pidfd=False)
    report = await run.run()
    assert report.exit_detection == "poll"
    assert any("polling" in n for n in report.notes)
    assert {o.fate for o in report.processes} == {Fate.EXITED}
    codes = {o.pid: o.exit_code for o in report.processes}
    child = tree.pids()[1]
    assert codes == {tree.pid: 0, child: 4}
    assert tree.root.wait(timeout=30) == 0
    assert tree.markers()[tree.pid]["reaped"] == {str(child): 4}


async def test_hundreds_of_processes_end_in_one_pass(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a root with 200 forked children; 2. terminate; 3. all 201 exited gracefully."""
    tree = start_tree(janitor, {"forks": 200}, tmp_path)
    report = await terminate([Target(tree.pid)], KillPolicy(tier_timeout_s=30, deadline_s=60))
    assert len(report.processes) == 201
    assert report.counts()["exited"] == 201
    assert all(not alive(p) for p in tree.pids())


async def test_on_update_errors_do_not_stop_the_kill(janitor: ProcessJanitor) -> None:
    """1. a process; 2. terminate with an on_update that raises; 3. the process exited."""
    proc = janitor.spawn_python(SLEEPER)

    def broken(_: ProcessOutcome) -> None:
        raise RuntimeError("boom")

    report = await terminate([Target(proc.pid)], KillPolicy(deadline_s=10), on_update=broken)
    assert [o.fate for o in report.processes] == [Fate.EXITED]
    assert report.processes[0].exit_code == -signal.SIGTERM
    wait_for(lambda: proc.poll() is not None, what="the process to be reaped")
