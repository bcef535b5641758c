"""What an operator reads: refusals that name the flag (never a traceback or a pydantic field),
warnings for settings that are legal but probably wrong, the effective settings at start,
one log line per process fate and per drain, errors that name the address, exit codes in
``--help``, and a quiet exit when the reader of the output goes away."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator import exit_codes
from tests.kill.helpers import start_tree
from tests.service.servers import FAST, ROOT, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

COMMAND = [sys.executable, "-m", "coordinator"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})


def plain(result: subprocess.CompletedProcess[str]) -> None:
    """An operator's message: no traceback, no internal field name, no pydantic link."""
    for word in ("Traceback", "pydantic", "_s\n", "grace_period_s", "validation error"):
        assert word not in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--grace-period", "10", "--safety-margin", "15"], {},
     ["--safety-margin 15", "--grace-period 10"]),
    (["--adopt-pattern", "([unclosed"], {}, ["--adopt-pattern", "([unclosed"]),
    (["--grace-period", "-1"], {}, ["--grace-period", "greater than 0", "-1"]),
    ([], {"SHUTDOWN_COORDINATOR_GRACE_PERIOD_S": "soon"},
     ["--grace-period (env SHUTDOWN_COORDINATOR_GRACE_PERIOD_S)", "'soon'"]),
    (["--max-handoffs", "0"], {}, ["--max-handoffs"]),
], ids=["margin >= grace", "bad pattern", "negative grace", "bad env number", "zero cap"])
def test_settings_that_cannot_work_refuse_the_start_naming_the_flag(
    args: list[str], env: dict[str, str], named: list[str]
) -> None:
    result = run("serve", "--port", "0", *args, env=env)
    assert result.returncode == exit_codes.USAGE
    assert result.stdout == ""  # never listened
    for text in named:
        assert text in result.stderr
    plain(result)


def test_legal_but_doubtful_settings_are_warned_and_the_effective_ones_logged(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. serve with a misspelled variable (``…_GRACE_PERIOD`` for ``…_GRACE_PERIOD_S``) and
    an ``--adopt-pid`` of no process; 2. it starts, and its log warns of both (naming the
    right variable) and gives the budget split it will use: 12 - 1 = 11 s, 40 % of it (at
    least one 2 s tier plus 1 s of confirmation) for termination."""
    free_pid = _unused_pid()
    os.environ["SHUTDOWN_COORDINATOR_GRACE_PERIOD"] = "30"
    try:
        running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pid", str(free_pid),
                                    "--log-level", "info")
    finally:
        del os.environ["SHUTDOWN_COORDINATOR_GRACE_PERIOD"]
    text = wait_for(lambda: "listening" in running.log.read_text() and running.log.read_text(),
                    what="the start-up log")
    assert ("environment variable SHUTDOWN_COORDINATOR_GRACE_PERIOD names no setting and is "
            "ignored; did you mean SHUTDOWN_COORDINATOR_GRACE_PERIOD_S?") in text
    assert f"--adopt-pid {free_pid}: no such process now" in text
    assert "settings: engine=generic budget_s=11.0 migration_s=6.6 termination_s=4.4" in text
    assert "security: auth OFF; bind 127.0.0.1 (loopback)" in text
    # One log format: uvicorn's own records go through it too.
    assert re.search(r"^\S+ \S+ INFO uvicorn\.error: Started server process", text, re.M)


def test_each_process_fate_and_the_drain_end_are_logged_as_they_happened(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a registered tree whose nodes run their cleanup on SIGTERM and exit 0; 2. a drain;
    3. the summary is true (the tree's own records, the root's wait status); 4. the log has
    one ``drain process:`` line per process with its pid, fate and exit code, the same as
    that truth, and one ``drain end:`` line with the outcome and the counts."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--log-level", "info")
    tree = start_tree(janitor, {"children": [{"children": [{}]}, {}]}, tmp_path / "tree")
    register(running, tree.pid)
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    truth = assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    text = wait_for(lambda: "drain end:" in running.log.read_text() and running.log.read_text(),
                    what="the drain's end in the log")
    logged = {int(m["pid"]): (m["fate"], int(m["code"])) for m in re.finditer(
        r"drain process: pid=(?P<pid>\d+) .*?fate=(?P<fate>\w+) .*?exit_code=(?P<code>-?\d+)",
        text)}
    assert logged == {pid: (e.fate, e.exit_code) for pid, e in truth.items()}
    assert len(re.findall("drain process:", text)) == len(tree.pids())
    end = re.search(r"drain end: outcome=graceful reason=preStop .* processes=4 "
                    r"running=0 exited=4 killed=0 gone=0 survived=0 .*lost_requests=0", text)
    assert end, text


def test_errors_name_the_address_and_help_lists_the_exit_codes() -> None:
    result = run("status", "--url", "http://127.0.0.1:1")
    assert result.returncode == exit_codes.UNREACHABLE
    assert "cannot reach the coordinator at http://127.0.0.1:1" in result.stderr
    plain(result)
    help_text = run("--help").stdout
    for name in ("OK", "KILLED", "LOST_REQUESTS", "NOTHING_TO_DRAIN"):
        assert re.search(rf"^\s+{getattr(exit_codes, name)}\s+{name}$", help_text, re.M)


def test_a_negative_drain_deadline_is_a_usage_error() -> None:
    result = run("drain", "--deadline", "-5", "--url", "http://127.0.0.1:1")
    assert result.returncode == exit_codes.USAGE
    assert "argument --deadline: -5 is not between 0 (excluded) and 86400 s" in result.stderr
    plain(result)


def test_a_reader_that_goes_away_ends_status_quietly(janitor: ProcessJanitor,
                                                     tmp_path: Path) -> None:
    """``status | head -1``: 1. the reader closes the pipe before anything is written;
    2. ``status`` exits 0 with nothing on stderr (no "Broken pipe", no traceback)."""
    running = start_coordinator(janitor, tmp_path)
    proc = subprocess.Popen([*COMMAND, "status", "--url", running.url], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == exit_codes.OK
    assert err == b""


def _unused_pid() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))


def test_the_plan_is_the_order_the_processes_then_get_their_sigterm(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a registered tree (root → a "scheduler" with a child, and a "detok") declaring a
    ``schedulers`` tier by role pattern; 2. ``status --plan`` (JSON and text) lists every
    process of the tree once: the declared tier first, then the rest deepest first, the root
    last; 3. ``status`` shows the budget, the auth mode and the tree with command lines;
    4. ``status --watch --json`` follows a drain and ends by itself at ``done``; 5. the
    processes' own records say each tier's SIGTERM came after the previous tier's last
    process ended, in the plan's order, and the summary is true."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, {"role": "root", "children": [
        {"role": "scheduler", "children": [{"role": "leaf"}]}, {"role": "detok"}]},
        tmp_path / "tree")
    register(running, tree.pid, tiers=[{"name": "schedulers", "pattern": "scheduler"}])
    roles = {int(p["pid"]): p["role"] for p in tree.processes}

    def planned() -> dict[str, Any] | None:
        result = run("status", "--plan", "--json", "--url", running.url)
        plan = json.loads(result.stdout)
        return plan if plan["processes"] == len(roles) else None

    plan = wait_for(planned, what="the tree listed by a scan")
    steps = [(t["tier"], sorted(roles[p["pid"]] for p in t["processes"])) for t in plan["tiers"]]
    assert steps == [("schedulers", ["scheduler"]), ("depth-2", ["leaf"]),
                     ("depth-1", ["detok"]), ("roots", ["root"])]
    assert {p["signal"] for t in plan["tiers"] for p in t["processes"]} == {"SIGTERM"}
    text = run("status", "--plan", "--url", running.url).stdout
    assert text.startswith("kill plan: 4 tiers, 4 processes")
    for pid in roles:
        assert re.search(rf"^\d\s+\S+\s+\S+\s+\S+\s+SIGTERM\s+{pid}\s", text, re.M), text
    shown = run("status", "--url", running.url).stdout
    assert "security    auth OFF, bind 127.0.0.1 (loopback)" in shown
    assert "budget      11s: 6.6s to migrate, 4.4s to terminate (tiers of 2s)" in shown
    # the command column: the program by its base name, whatever the install path's length
    assert re.search(r"\bpython[\d.]* -m tests\.kill\.trees \{", shown), shown

    watcher = subprocess.Popen([*COMMAND, "status", "--watch", "--json", "--url", running.url],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    out, _ = watcher.communicate(timeout=120)
    assert watcher.returncode == exit_codes.OK
    assert json.loads(out.splitlines()[-1])["phase"] == "done"
    assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    records = {pid: r for pid, r in tree.markers().items()}
    order = [[pid for pid in roles if roles[pid] in step[1]] for step in steps]
    for before, after in itertools.pairwise(order):
        assert max(records[p]["ended_at"] for p in before) <= min(
            records[p]["signalled_at"] for p in after)
