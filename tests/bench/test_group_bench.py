"""The group benchmark (``bench/group.py``) cannot lie: its counting, on made-up records of
how the processes of a group ended and made-up client streams, says what those records say;
and one small real run (a follower evicted alone, drained by its own pod's coordinator, which
breaks the group) is held against the ranks' own records and ``/proc``."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psutil

from bench.group_rig import EVICTION, PER_POD, Params, run_once
from bench.group_truth import (
    KILLED,
    PodTruth,
    Proc,
    ProcessEnd,
    RunResult,
    WayTotals,
    comparison,
    count_causes,
    count_codes,
    format_counts,
    lost,
    process_ends,
    ratio,
    time_to_empty,
    tokens_damage,
)
from devstack.sim.group.protocol import CAUSE_FINISHED, CAUSE_LEFT, CAUSE_TIMED_OUT
from devstack.sim.tokens import expected_tokens
from devstack.streaming_load import ClientStream
from tests.support.processes import ProcessJanitor

MAIN, RANK, DETOK = "main", "scheduler", "detokenizer"


def record(pid: int, role: str, *, code: int | None, cause: str | None = None,
           **extra: Any) -> dict[str, Any]:
    """An end record as ``devstack.sim.records`` writes it (``code`` None: never ended)."""
    ended = None if code is None else 1.0
    return {"pid": pid, "role": role, "exit_code": code, "ended_at": ended, "cause": cause,
            **extra}


def leader(main_code: int | None, *records: dict[str, Any]) -> PodTruth:
    return PodTruth(0, 10, main_code, (Proc(10, MAIN), Proc(11, RANK, 0), Proc(12, DETOK)),
                    records)


def test_a_graceful_pod_is_all_zeros_seen_by_waitpid_and_the_parent() -> None:
    pod = leader(0, record(10, MAIN, code=0, children_exit_codes={"11": 0, "12": 0}),
                 record(11, RANK, code=0, cause=CAUSE_FINISHED), record(12, DETOK, code=0))
    ends = process_ends(pod)
    assert [(e.pid, e.exit_code, e.seen_by) for e in ends] == [
        (10, 0, "waitpid"), (11, 0, "parent"), (12, 0, "parent")]
    assert [e.cause for e in ends] == [None, CAUSE_FINISHED, None]
    assert not [e for e in ends if e.crashed]
    assert count_codes(ends) == {"0": 3}


def test_a_leader_killed_by_its_watchdog_counts_the_abort_and_the_unseen_kill() -> None:
    """Rank 0 aborted (its own record: -6), the main process SIGKILLed its tree and itself
    (the bench's waitpid: -9), so nobody recorded the detokenizer's end."""
    pod = leader(-signal.SIGKILL, record(10, MAIN, code=None),
                 record(11, RANK, code=-signal.SIGABRT, cause=CAUSE_TIMED_OUT),
                 record(12, DETOK, code=None))
    ends = process_ends(pod)
    assert [(e.exit_code, e.seen_by) for e in ends] == [
        (-9, "waitpid"), (-6, "own record"), (None, "nobody")]
    assert [e.pid for e in ends if e.crashed] == [11]
    assert count_codes(ends) == {"-9": 1, "-6": 1, "?": 1}
    assert count_causes(ends) == {CAUSE_TIMED_OUT: 1}


def test_the_parents_waitpid_wins_over_a_ranks_own_word() -> None:
    """A follower whose main SIGKILLed a rank (its record never ended: cause ``killed``) and
    saw another one end by a signal after its record said 0."""
    pod = PodTruth(1, 20, 6, (Proc(20, MAIN), Proc(21, RANK, 1), Proc(22, RANK, 2)), (
        record(20, MAIN, code=6, children_exit_codes={"21": -9, "22": -15}),
        record(21, RANK, code=None),
        record(22, RANK, code=0, cause=CAUSE_LEFT)))
    ends = process_ends(pod)
    assert [(e.exit_code, e.seen_by, e.cause) for e in ends] == [
        (6, "waitpid", None), (-9, "parent", KILLED), (-15, "parent", CAUSE_LEFT)]
    assert sum(e.crashed for e in ends) == 2


def test_a_rank_that_left_with_exit_0_did_not_crash_but_says_it_left() -> None:
    pod = PodTruth(2, 30, 0, (Proc(30, MAIN), Proc(31, RANK, 2)), (
        record(30, MAIN, code=0, children_exit_codes={"31": 0}),
        record(31, RANK, code=0, cause=CAUSE_LEFT)))
    ends = process_ends(pod)
    assert not [e for e in ends if e.crashed]
    assert count_causes(ends) == {CAUSE_LEFT: 1}


def test_a_main_still_running_and_a_rank_without_a_record_are_unknown() -> None:
    pod = PodTruth(3, 40, None, (Proc(40, MAIN), Proc(41, RANK, 3)), ())
    ends = process_ends(pod)
    assert [(e.exit_code, e.seen_by, e.cause) for e in ends] == [
        (None, "nobody", None), (None, "nobody", KILLED)]
    assert [e.crashed for e in ends] == [False, True]


def stream(tokens: list[str], *, done: bool = True, n: int = 6) -> ClientStream:
    return ClientStream("p", n, tokens=tokens, done=done)


def test_only_a_whole_exact_stream_is_not_lost() -> None:
    want = expected_tokens("p", 6)
    exact = stream(list(want))
    cut = stream(want[:3], done=False)
    short = stream(want[:5])
    duplicated = stream([*want[:3], want[2], *want[3:]])
    wrong = stream([*want[:5], "x"])
    assert lost([exact, cut, short, duplicated, wrong]) == [cut, short, duplicated, wrong]
    assert tokens_damage([exact]) == (0, 0)
    assert tokens_damage([cut, duplicated]) == (3, 1)


def test_time_to_empty_is_the_last_end_and_none_while_anything_runs() -> None:
    assert time_to_empty(100.0, {1: 100.5, 2: 102.25, 3: 101.0}) == 2.25
    assert time_to_empty(100.0, {1: 100.5, 2: None}) is None
    assert time_to_empty(100.0, {}) is None


def test_counts_are_shown_most_frequent_first() -> None:
    assert format_counts({"0": 2, "-6": 3, "?": 1, "6": 0}) == "-6: 3, 0: 2, ?: 1"
    assert format_counts({}) == "none"


def run(way: str, *, lost_: int = 0, empty: float | None = 1.0, hooks: float = 1.0,
        main_code: int = 0, rank_code: int = 0, scenario: str = "deletion") -> RunResult:
    ends = [ProcessEnd(0, 1, MAIN, None, main_code, "waitpid", None),
            ProcessEnd(0, 2, RANK, 0, rank_code, "own record", CAUSE_FINISHED)]
    return RunResult(way, scenario, 4, lost_, 0, 0, lost_, ends, empty, hooks, ["graceful"])


def test_totals_keep_ways_and_scenarios_apart_and_say_where_the_group_is_slower() -> None:
    runs = [run("per-pod", lost_=2, empty=5.0, hooks=0.2, main_code=-9, rank_code=-6),
            run("per-pod", empty=None, hooks=0.4),
            run("group", empty=1.0, hooks=1.0), run("group", empty=2.0, hooks=1.2),
            run("group", scenario="eviction", lost_=9)]
    per_pod = WayTotals.of("per-pod", "deletion", runs)
    group = WayTotals.of("group", "deletion", runs)
    assert (per_pod.runs, per_pod.lost, per_pod.crashed, per_pod.pods_broken) == (2, 2, 1, 1)
    assert (per_pod.empty_s, per_pod.not_empty) == ([5.0], 1)
    assert (group.runs, group.lost, group.crashed, group.empty_s) == (2, 0, 0, [1.0, 2.0])
    assert group.codes == {"0": 4}
    lines = comparison(per_pod, group)
    assert all(line.startswith("deletion: ") for line in lines)
    text = "\n".join(lines)
    assert "requests lost, per pod / group: 2 against none" in text
    assert "time to empty, median: per pod 5.00 s, group 1.50 s" in text
    assert "group drain is faster, by 3.50 s" in text
    assert "hooks returned, median: per pod 0.30 s, group 1.10 s" in text
    assert "group drain is SLOWER, by 0.80 s" in text
    assert "runs not empty within the bound: per pod 1, group 0" in text


def test_ratios_stay_true_at_zero() -> None:
    assert ratio(0, 0) == "none either"
    assert ratio(3, 0) == "3 against none"
    assert ratio(3, 2) == "x1.50"


async def test_a_follower_evicted_alone_per_pod_breaks_the_group_as_its_records_say(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A group of a leader and 2 followers, a coordinator per pod knowing no group, 4
    streams through the router. 2. Follower 2's hook alone (the eviction scenario): its
    rank leaves, the leader's next step hangs, ranks 0 and 1 abort after the collective
    timeout, the leader's watchdog kills its pod. 3. The run's figures are what the ranks'
    records and /proc say: the rank that left is not counted crashed, the two that aborted
    are, every stream the leader broke was continued by the router (none lost), the time to
    empty is past the collective timeout, and no process of the group is left."""
    params = Params(size=3, streams=4, max_tokens=100, collective_timeout_s=2.0)
    result = await run_once(PER_POD, EVICTION, params, tmp_path / "run", janitor)

    ranks = {e.rank: e for e in result.ends if e.is_rank}
    assert set(ranks) == {0, 1, 2}
    assert (ranks[2].exit_code, ranks[2].cause, ranks[2].crashed) == (0, CAUSE_LEFT, False)
    for rank in (0, 1):
        assert (ranks[rank].exit_code, ranks[rank].cause) == (-6, CAUSE_TIMED_OUT), ranks[rank]
    assert result.crashed == 2
    mains = {e.pod: e.exit_code for e in result.ends if e.role == MAIN}
    assert mains == {0: -9, 1: 6, 2: 0}
    assert result.lost == 0, result
    assert result.broken >= 1, result
    assert result.empty_s is not None
    assert result.empty_s >= params.collective_timeout_s
    assert result.verdicts == ["graceful"]  # the evicted pod's coordinator saw only its pod
    assert not [e.pid for e in result.ends if psutil.pid_exists(e.pid)]
