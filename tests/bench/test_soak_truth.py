"""The chaos soak's judgement of a summary against the truth (``bench/soak_truth.py``), on
made-up drains: what it must accept and what it must call untrue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.soak_truth import CRASH, FORCE, NORMAL, Ending, _fates, check_summary, endings
from devstack.sim.launcher import EngineHandle

MAIN, CHILD, GRANDCHILD = 100, 101, 102


class Ended:
    """A main process that already ended (what ``EngineHandle`` needs of a ``Popen``)."""

    pid = MAIN

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def ending(pid: int, *, clean: bool, code: int | None, mode: str = NORMAL,
           watchdog: bool = False) -> Ending:
    return Ending(pid, "main" if pid == MAIN else "child", clean, code,
                  _fates(clean, mode, watchdog), pid == MAIN)


def summary(outcome: str, *entries: tuple[int, str, int | None]) -> dict[str, Any]:
    processes = [{"pid": pid, "fate": fate, "exit_code": code} for pid, fate, code in entries]
    return {"phase": "done", "outcome": outcome, "processes": processes,
            "drain": {"lost_requests": 0}}


def test_a_graceful_drain_told_as_it_was_is_true() -> None:
    truth = {MAIN: ending(MAIN, clean=True, code=0), CHILD: ending(CHILD, clean=True, code=0)}
    said = summary("graceful", (MAIN, "exited", 0), (CHILD, "exited", 0))
    assert check_summary(said, truth, mode=NORMAL, clients_done=True) == []


def test_a_missing_process_a_wrong_fate_code_or_outcome_is_untrue() -> None:
    truth = {MAIN: ending(MAIN, clean=True, code=0), CHILD: ending(CHILD, clean=False, code=-9)}
    assert check_summary(summary("killed", (MAIN, "exited", 0)), truth, mode=NORMAL,
                         clients_done=True) == ["not listed: [(101, 'child')]"]
    wrong = check_summary(summary("graceful", (MAIN, "exited", 0), (CHILD, "exited", 0)),
                          truth, mode=NORMAL, clients_done=True)
    assert any("fate exited" in w for w in wrong)
    assert any("exit code 0, truth -9" in w for w in wrong)
    assert "outcome 'graceful', truth 'killed'" in wrong


def test_a_crash_is_gone_and_signalled_a_force_drain_killed() -> None:
    crash = {pid: ending(pid, clean=False, code=-9, mode=CRASH) for pid in (MAIN, CHILD)}
    said = summary("signalled", (MAIN, "gone", -9), (CHILD, "gone", -9))
    assert check_summary(said, crash, mode=CRASH, clients_done=False) == []
    force = {pid: ending(pid, clean=False, code=-9, mode=FORCE) for pid in (MAIN, CHILD)}
    said = summary("killed", (MAIN, "killed", -9), (CHILD, "gone", -9))
    assert check_summary(said, force, mode=FORCE, clients_done=False) == []


def test_a_main_process_whose_watchdog_fired_may_have_ended_after_its_sigterm() -> None:
    truth = {MAIN: ending(MAIN, clean=False, code=-9, watchdog=True),
             CHILD: ending(CHILD, clean=True, code=None, watchdog=True)}
    said = summary("signalled", (MAIN, "exited", -9), (CHILD, "exited", -9))
    assert check_summary(said, truth, mode=NORMAL, clients_done=True) == []
    assert check_summary({**said, "outcome": "graceful"}, truth, mode=NORMAL,
                         clients_done=True) == ["outcome 'graceful', truth 'signalled'"]


def test_lost_requests_claimed_while_every_stream_completed_is_untrue() -> None:
    truth = {MAIN: ending(MAIN, clean=True, code=0)}
    said = {**summary("lost_requests", (MAIN, "exited", 0)), "drain": {"lost_requests": 2}}
    assert any("2 lost requests claimed" in w
               for w in check_summary(said, truth, mode=NORMAL, clients_done=True))
    assert check_summary(said, truth, mode=NORMAL, clients_done=False) == []


def test_a_process_killed_on_its_way_out_after_its_cleanup_is_killed(tmp_path: Path) -> None:
    """Its record says its cleanup finished, yet its parent saw -9: it did not end in time
    (a stall after the record was written), and the drain's SIGKILL ended it."""
    for pid, role, codes in ((MAIN, "main", {str(CHILD): -9}), (CHILD, "scheduler", {})):
        (tmp_path / f"{role}-{pid}.json").write_text(json.dumps(
            {"pid": pid, "role": role, "cleanup": "finished", "signals": ["SIGTERM"],
             "exit_code": 0, "children_exit_codes": codes, "detail": "", "started_at": 1.0}))
    engine = EngineHandle(proc=Ended(), record_dir=tmp_path, ready={"pid": MAIN})
    truth = endings(engine, [MAIN, CHILD], 0, {}, NORMAL)
    assert (truth[CHILD].clean, truth[CHILD].exit_code, truth[CHILD].fates) == (
        False, -9, frozenset({"killed"}))
    said = summary("killed", (MAIN, "exited", 0), (CHILD, "killed", -9))
    assert check_summary(said, truth, mode=NORMAL, clients_done=True) == []
    said = summary("graceful", (MAIN, "exited", 0), (CHILD, "exited", 0))
    assert check_summary(said, truth, mode=NORMAL, clients_done=True) == [
        "scheduler 101: fate exited, truth killed (exit -9)",
        "scheduler 101: exit code 0, truth -9", "outcome 'graceful', truth 'killed'"]
