"""What ``status``, ``status --plan``, ``drain`` and ``kill`` print, for any document: one
rendering rule for text from outside (``render.shown``), so no value breaks a row, drives
the terminal or reorders a line; a finished drain told as finished; nothing blank."""

from __future__ import annotations

import re
import time
import unicodedata
from typing import Any

import pytest

from coordinator.cli.kill import render as kill_render
from coordinator.kill.report import Fate, KillReport, ProcessOutcome
from coordinator.service.render import plan_text, progress_line, shown, status_text, table

HOSTILE = [
    "python -m engine --name 'a\nb'",  # a newline: a second row
    "evil\r\x1b[2J\x1b[31mred",  # carriage return, clear screen, colour
    "abc\u202egnp.exe",  # right-to-left override
    "zero\u200bwidth\u2066iso\u2069\u2028line\u00a0nbsp\x85next\x7fdel\tTab",
]


def printable_lines(text: str) -> list[str]:
    lines = text.split("\n")
    for line in lines:
        assert line.isprintable(), repr(line)
    return lines


@pytest.mark.parametrize("value", HOSTILE)
def test_shown_escapes_every_unprintable_character_and_keeps_the_rest(value: str) -> None:
    text = shown(value)
    assert text.isprintable()
    assert all(c in text for c in value if c.isprintable())
    for c in value:
        if not c.isprintable():
            assert unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Zs")


def test_shown_writes_escapes_a_person_can_read() -> None:
    assert shown("a\nb\tc\rd\x1b[0m\u202e") == "a\\nb\\tc\\rd\\x1b[0m\\u202e"
    assert shown("plain text, émigré, 模型") == "plain text, émigré, 模型"


def process(pid: int, cmdline: str, **more: Any) -> dict[str, Any]:
    return {"pid": pid, "name": cmdline.split()[0][:15], "cmdline": cmdline, "fate": "running",
            "exit_code": None, "depth": 0, "role": "adopted", **more}


def test_hostile_command_lines_keep_one_row_each_in_status_and_plan() -> None:
    """Each hostile value in a process's command line and name, a worker's role and URL,
    the drain's reason, a cause: ``status`` prints one row per process, ``--plan`` one row
    per process, and no line holds a character a terminal would act on."""
    processes = [process(100 + i, v, name=v[:15]) for i, v in enumerate(HOSTILE)]
    now = time.time()
    doc = {"phase": "draining", "generation": 3,
           "drain": {"reason": HOSTILE[1], "started_at": now - 1, "deadline_at": now + 20,
                     "causes": [HOSTILE[0]]},
           "workers": [{"id": "w-1", "pid": 100, "role": HOSTILE[2], "state": "serving",
                        "inflight": 0, "url": HOSTILE[3]}],
           "processes": processes, "counts": {"running": len(processes)},
           "routers": [{"kind": "smg", "url": HOSTILE[0], "state": "failed",
                        "error": HOSTILE[1]}]}
    lines = printable_lines(status_text(doc))
    rows = [line for line in lines if line[:3].isdigit()]
    assert [int(r.split()[0]) for r in rows] == [p["pid"] for p in processes]
    plan = {"processes": len(processes), "tiers": [{
        "tier": HOSTILE[2], "timeout_s": 10.0, "wait_s": {"least": 1.0, "most": 4.0},
        "processes": [{"pid": p["pid"], "name": p["name"], "role": HOSTILE[0],
                       "signal": "SIGTERM", "cmdline": p["cmdline"]} for p in processes]}]}
    plan_lines = printable_lines(plan_text(plan))
    assert len([line for line in plan_lines if line.startswith("1 ")]) == len(processes)
    printable_lines(progress_line(doc))
    waited = {**processes[1], "signalled_at": now - 1, "kill_at": now + 1}
    printable_lines(progress_line({**doc, "processes": [waited]}, width=60))


def test_the_kill_report_keeps_one_row_a_process() -> None:
    report = KillReport(started_at=time.time(), processes=[
        ProcessOutcome(pid=100 + i, name=v[:15], cmdline=v, fate=Fate.EXITED, exit_code=0,
                       start_time=1.0) for i, v in enumerate(HOSTILE)])
    report.notes.append(HOSTILE[1])
    lines = printable_lines(kill_render(report))
    assert len([line for line in lines if line[:3].isdigit()]) == len(HOSTILE)


def test_a_table_cell_never_holds_two_lines() -> None:
    text = table(["a", "b"], [["x\ny", "z"], [1, None]])
    assert text.splitlines() == ["a     b", "----  -", "x\\ny  z", "1     -"]


def test_a_finished_drain_says_when_it_ended_not_a_deadline_ago() -> None:
    now = time.time()
    drain: dict[str, Any] = {"reason": "operator", "started_at": now - 12.0,
                             "ended_at": now - 9.7, "deadline_at": now + 13.0,
                             "budget_s": 25.0, "outcome": "graceful", "causes": []}
    doc = {"phase": "done", "generation": 9, "processes": [], "counts": {}, "drain": drain}
    line = next(x for x in status_text(doc).splitlines() if x.startswith("drain "))
    assert "deadline" not in line
    assert line.startswith("drain       'operator', started 12.0s ago, ended 9.7s ago, after "
                           "2.3s of its 25s budget"), line
    running = {**doc, "phase": "draining", "drain": {**drain, "ended_at": None}}
    line = next(x for x in status_text(running).splitlines() if x.startswith("drain "))
    assert re.search(r", deadline in 1[23]\.\ds$", line), line


def test_an_empty_status_has_no_blank_processes_line() -> None:
    doc = {"phase": "serving", "generation": 1, "processes": [],
           "counts": {"running": 0, "exited": 0}}
    lines = status_text(doc).splitlines()
    assert "processes   none registered or adopted" in lines
    assert not [line for line in lines if line.startswith("processes") and not line[12:]]
    assert all(line == line.rstrip() for line in lines)
