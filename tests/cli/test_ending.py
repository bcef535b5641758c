"""Every command ends the same way when it is cut short (``coordinator/cli/ending.py``):
Ctrl-C says, in one line, what goes on without it and how to stop or abort that, and exits
130, without a traceback; a reader that goes away keeps the outcome's exit code.

What each line says is held against what really goes on: the coordinator's phase, the
processes (alive, no cleanup record), and the line's own advice, run as printed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil

from coordinator import exit_codes
from tests.kill.helpers import alive, start_tree
from tests.service.servers import ROOT, Running, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.argv[1], sys.argv[1:])")
"""Runs a command with SIGINT's default action, as a terminal gives it: Python turns SIGINT
into KeyboardInterrupt only when it was not ignored at its start, and a test run started in
the background (``cmd &`` in a script) ignores it."""
COMMAND = [sys.executable, "-m", "coordinator"]
DEMO = Path(sys.executable).parent / "shutdown-coordinator-demo"
LONG_DRAIN = ["--grace-period", "300", "--safety-margin", "1", "--min-drain", "250",
              "--scan-interval", "0.5"]
"""A drain that stays in ``draining`` for minutes: long enough to interrupt what follows it."""


def interactive(janitor: ProcessJanitor, argv: list[str], out: Path,
                err: Path) -> subprocess.Popen[Any]:
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return janitor.spawn([sys.executable, "-c", DEFAULT_SIGINT, *argv], cwd=ROOT,
                             stdout=stdout, stderr=stderr)


def interrupt(proc: subprocess.Popen[Any], err: Path) -> str:
    """SIGINT as Ctrl-C sends it; the command must exit 130 and say one line, no traceback."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == exit_codes.INTERRUPTED, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("interrupted: ")]
    assert len(lines) == 1, text
    return lines[0]


def advice(line: str) -> list[list[str]]:
    """The commands a line tells the operator to run (between backticks)."""
    return [shlex.split(c) for c in re.findall(r"`(shutdown-coordinator [^`]*)`", line)]


def run_advice(command: list[str]) -> subprocess.CompletedProcess[str]:
    assert command[0] == "shutdown-coordinator"
    return subprocess.run([*COMMAND, *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def phase(running: Running) -> str:
    return str(running.status()["phase"])


def test_drain_and_watch_interrupted_say_the_drain_goes_on_and_how_to_abort_it(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator whose drain stays in ``draining`` (``--min-drain``), a registered
       tree. 2. ``drain`` runs; once it printed its progress, Ctrl-C: exit 130, one line
       saying the drain goes on in the coordinator, how to follow it and how to abort it.
    3. So it does: the coordinator is still draining, every process of the tree runs and
       none ran its cleanup. 4. ``status --watch``, interrupted the same way, says the same.
    5. The abort the lines advise, run as printed, brings the coordinator back to serving;
       the tree was never signalled."""
    running = start_coordinator(janitor, tmp_path, *LONG_DRAIN)
    tree = start_tree(janitor, {"role": "root", "children": [{"role": "child"}]},
                      tmp_path / "tree")
    register(running, tree.pid)
    out, err = tmp_path / "drain.out", tmp_path / "drain.err"
    drain = interactive(janitor, [*COMMAND, "drain", "--url", running.url], out, err)
    wait_for(lambda: "[draining]" in err.read_text(), what="the drain's progress")
    line = interrupt(drain, err)
    url = running.url
    assert line == (
        f"interrupted: the drain goes on in the coordinator at {url}: `shutdown-coordinator "
        f"status --watch --url {url}` follows it, `shutdown-coordinator drain --abort --url "
        f"{url}` aborts it until it terminates processes")
    assert phase(running) == "draining"
    assert all(alive(pid) for pid in tree.pids())
    assert tree.markers() == {}

    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    watch = interactive(janitor, [*COMMAND, "status", "--watch", "--url", url], out, err)
    wait_for(lambda: "phase       draining" in out.read_text(), what="the watched state")
    line = interrupt(watch, err)
    assert line == (f"interrupted: stopped watching; a running drain goes on in the "
                    f"coordinator at {url} (`shutdown-coordinator drain --abort --url {url}` "
                    "aborts it until it terminates processes)")
    assert phase(running) == "draining"

    (abort,) = advice(line)
    done = run_advice(abort)
    assert done.returncode == exit_codes.OK, done.stderr
    assert done.stdout.startswith("aborted: the coordinator is serving again"), done.stdout
    assert phase(running) == "serving"
    assert all(alive(pid) for pid in tree.pids())
    assert tree.markers() == {}
    tree.end()


def test_serve_interrupted_says_the_drain_goes_on_and_how_to_stop_at_once(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator drains a registered tree (staying in ``draining``). 2. Ctrl-C: it
       says the drain goes on to its end and that Ctrl-C again stops it now; it still
       serves and drains. 3. Ctrl-C again: it stops, exit 130, no traceback; the drain was
       left unfinished (the tree runs, never signalled)."""
    running = start_coordinator(janitor, tmp_path, *LONG_DRAIN, "--log-level", "info")
    tree = start_tree(janitor, {"role": "root"}, tmp_path / "tree")
    register(running, tree.pid)
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    running.proc.send_signal(signal.SIGINT)
    said = wait_for(lambda: re.search(r"^interrupted: .*$", running.log.read_text(), re.M),
                    what="the coordinator's line")
    assert re.fullmatch(r"interrupted: the running drain goes on to its end \(\d+ s of its "
                        r"budget left\), then the coordinator stops; Ctrl-C again stops it "
                        r"now and leaves the drain unfinished", said.group(0)), said.group(0)
    assert httpx.get(running.url + "/healthz", timeout=30).status_code == 200
    assert phase(running) == "draining"
    running.proc.send_signal(signal.SIGINT)
    assert running.proc.wait(timeout=120) == exit_codes.INTERRUPTED
    assert "Traceback" not in running.log.read_text()
    assert alive(tree.pid)
    assert tree.markers() == {}
    tree.end()


def test_kill_interrupted_stops_where_it_was_and_the_advice_ends_the_rest(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A tree: a root and a child whose cleanup takes minutes and which forks on SIGTERM.
    2. ``kill --pattern``: once the child got its SIGTERM (its fork's record), Ctrl-C: exit
       130, one line: the kill stopped where it was, and how to end the rest. 3. So it did:
       the root was never signalled (it runs: its SIGTERM would end it at once), the child is
       still in its cleanup. 4. The advice, the same command with ``--force``, ends them."""
    tree = start_tree(janitor, {"role": "root", "children": [
        {"role": "slow", "teardown": 600, "fork_on_term": True}]}, tmp_path / "tree")
    out, err = tmp_path / "kill.out", tmp_path / "kill.err"
    argv = ["--pattern", tree.pattern, "--tier-timeout", "300", "--deadline", "600"]
    kill = interactive(janitor, [*COMMAND, "kill", *argv], out, err)
    wait_for(lambda: tree.markers("forked"), what="the child's SIGTERM")
    line = interrupt(kill, err)
    assert line == ("interrupted: the kill stopped where it was: processes it signalled may "
                    "still be exiting, the rest were not signalled; run the same command "
                    "again to end what is left (with --force: SIGKILL at once)")
    assert alive(tree.pid)
    assert alive(tree.pids("slow")[0])
    assert set(tree.markers()) == set(tree.markers("forked"))  # nobody finished a cleanup
    again = subprocess.run([*COMMAND, "kill", *argv, "--force", "--json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == exit_codes.KILLED, again.stderr
    ended = {p["pid"] for p in json.loads(again.stdout)["processes"]}
    assert set(tree.pids()) <= ended
    assert tree.root.wait(timeout=30) == -signal.SIGKILL
    assert not any(alive(pid) for pid in ended)


def test_the_demo_interrupted_ends_every_process_it_started(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. The demo runs; once its streams flow, Ctrl-C. 2. Exit 130, one line: the demo
       stopped and ended its pods, router and streams. 3. So it did: every process it had
       started (its descendants, listed with their start times just before) is gone."""
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    demo = interactive(janitor, [str(DEMO), "--streams", "4", "--tokens", "400"], out, err)
    wait_for(lambda: "every stream is flowing" in out.read_text(), timeout=170,
             what="the demo's streams")
    started = [(p.pid, p.create_time()) for p in psutil.Process(demo.pid).children(True)]
    assert len(started) > 6  # coordinators, engines, router
    line = interrupt(demo, err)
    assert line == "interrupted: the demo stopped; its pods, router and streams were ended"
    for pid, at in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(pid).create_time() != at, f"pid {pid} still runs"


def test_a_reader_gone_keeps_the_outcomes_exit_code(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """``drain --quiet | head -1`` under ``pipefail``: 1. a drain of a coordinator with
    nothing registered, its standard output closed before the summary is written; 2. it
    still exits 14 (nothing to drain), not 0, and says nothing of a broken pipe. 3. The
    same for ``kill`` of a PID that is gone: 14."""
    running = start_coordinator(janitor, tmp_path)
    for argv in (["drain", "--quiet", "--url", running.url],
                 ["kill", str(_unused_pid()), "--json"]):
        proc = subprocess.Popen([*COMMAND, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        assert proc.wait(timeout=120) == exit_codes.NOTHING_TO_DRAIN, (argv, err)
        assert "Traceback" not in err, err
        assert "Broken pipe" not in err, err
        assert "nothing to" in err, err


def _unused_pid() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))
