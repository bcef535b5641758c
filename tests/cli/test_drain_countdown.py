"""The drain's progress line counts down to the SIGKILL of the process it waits on: the
``kill_at`` of that process's ``/status`` entry (``coordinator/service/render.py``)."""

from __future__ import annotations

import os
import pty
import subprocess
import threading
from pathlib import Path
from typing import Any

from coordinator import exit_codes
from coordinator.service.render import progress_line, waiting_on
from tests.kill.helpers import start_tree
from tests.service.servers import FAST, ROOT, Running, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

SIGNAL_SLACK_S = 0.5
"""A process's own reading of the clock when its SIGTERM arrived lags the coordinator's
reading before it sent it by the process's wake-up, which a loaded machine can stretch."""

NOW = 1_000_000.0


def document(**process: Any) -> dict[str, Any]:
    """A ``/status`` document in ``terminating``: one process waited on, one ended, one not
    yet signalled; ``process`` overrides the waited-on one's entry."""
    waited = {"pid": 4242, "name": "EngineCore", "fate": "running", "tier": "depth-1",
              "signal": "SIGTERM", "signalled_at": NOW - 0.8, "kill_at": NOW + 7.2,
              "killed_at": None, **process}
    return {
        "phase": "terminating", "generation": 9, "migrations": [],
        "workers": [{"id": "w1", "pid": 1, "inflight": 0, "state": "exited"}],
        "drain": {"reason": "preStop", "started_at": NOW - 5, "deadline_at": NOW + 12.5},
        "counts": {"running": 2, "exited": 1},
        "processes": [
            waited,
            {"pid": 4243, "name": "detok", "fate": "exited", "signalled_at": NOW - 0.9},
            {"pid": 4200, "name": "api", "fate": "running", "signalled_at": None},
        ],
    }


def test_the_line_counts_down_to_the_sigkill_of_the_process_waited_on() -> None:
    line = progress_line(document(), now=NOW)
    assert line == (
        "[terminating] gen 9: 1 workers, 0 in flight, 0 migrations pending, 1/3 processes "
        "ended, 12.5s of budget left; waiting on 4242 EngineCore (tier depth-1, SIGTERM 0.8s "
        "ago, SIGKILL in 7.2s)")
    assert "SIGKILL in 2.2s" in progress_line(document(), now=NOW + 5)


def test_a_sigkill_due_or_sent_is_told_as_such() -> None:
    """1. past ``kill_at`` but not yet SIGKILLed (the next document is on its way): in 0.0s,
    never a negative time; 2. SIGKILLed, still confirming: how long ago."""
    assert "SIGKILL in 0.0s" in progress_line(document(), now=NOW + 8)
    killed = document(killed_at=NOW + 7.2)
    assert waiting_on(killed, now=NOW + 7.5) == (
        "waiting on 4242 EngineCore (tier depth-1, SIGTERM 8.3s ago, SIGKILL 0.3s ago)")
    forced = document(signalled_at=None, signal=None, kill_at=None, killed_at=NOW - 0.1)
    assert waiting_on(forced, now=NOW) == "waiting on 4242 EngineCore (tier depth-1, SIGKILL " \
        "0.1s ago)"


def test_a_document_without_kill_at_shows_no_countdown() -> None:
    """An older coordinator's document: the line is what it was."""
    assert waiting_on(document(kill_at=None), now=NOW) == (
        "waiting on 4242 EngineCore (tier depth-1, SIGTERM 0.8s ago)")


def test_a_narrow_terminal_keeps_the_process_waited_on_and_its_countdown() -> None:
    """80 columns: the line that would not fit names the process and its countdown first."""
    line = progress_line(document(), now=NOW, width=80)
    assert line == ("[terminating] waiting on 4242 EngineCore, SIGKILL in 7.2s; 1/3 ended, "
                    "12.5s left")
    assert len(progress_line(document(name="x" * 60), now=NOW, width=79)) == 79
    wide = progress_line(document(), now=NOW, width=500)
    assert wide == progress_line(document(), now=NOW)


def _follow(running: Running, what: str, until: Any) -> Any:
    """Long-poll ``/status`` generation after generation until ``until(doc)`` is truthy."""
    with running.client(timeout=60) as client:
        since = int(client.get("/status").json()["generation"])

        def step() -> Any:
            nonlocal since
            doc = client.get("/status", params={"wait": 5, "since": since}).json()
            since = int(doc["generation"])
            return until(doc)

        return wait_for(step, what=what, timeout=60)


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the last writer closed the terminal
            return
        if not chunk:
            return
        into.append(chunk)


def test_drain_on_a_terminal_counts_down_to_the_sigkill_it_waits_for(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a registered tree: the root, a child that ignores SIGTERM, and a sibling in the same
    tier that records when its SIGTERM came; 2. ``drain`` runs with its progress on a
    terminal (a pty, 80 columns); 3. while the kill waits on the stubborn child, its
    ``/status`` entry's ``kill_at`` is the tier's SIGTERM (the sibling's own record, and the
    coordinator's ``signalled_at``) plus the tier timeout (2 s, not cut: the budget leaves
    the root far more than its share); 4. the line rendered from that document, and the
    terminal's, say ``SIGKILL in``; 5. the child was SIGKILLed no earlier than its
    ``kill_at``, ``drain`` exits KILLED, and the summary is true."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True},
                                             {"role": "sibling"}]}, tmp_path / "tree")
    register(running, tree.pid)
    (stubborn,) = tree.pids("stubborn")
    (sibling,) = tree.pids("sibling")
    wait_for(lambda: len(running.status().get("processes", [])) == 3,
             what="the tree listed by a scan")
    tier_timeout_s = float(running.status()["settings"]["tier_timeout_s"])

    master, slave = pty.openpty()
    written: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, written), daemon=True)
    try:
        cli = janitor.spawn_python(["-m", "coordinator", "drain", "--url", running.url],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=slave,
                                   env={"COLUMNS": "80"})
        os.close(slave)
        slave = -1
        reader.start()

        def waited_on(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
            entry = next(p for p in doc.get("processes", []) if p["pid"] == stubborn)
            if entry["signalled_at"] and entry["fate"] == "running" \
                    and entry["killed_at"] is None:
                return doc, entry
            return None

        doc, entry = _follow(running, "the kill waiting on the stubborn child", waited_on)
        assert entry["kill_at"] is not None, entry
        assert abs(entry["kill_at"] - (entry["signalled_at"] + tier_timeout_s)) <= 0.05
        told = wait_for(lambda: tree.markers().get(sibling),
                        what="the sibling's record of its SIGTERM")
        assert abs(entry["kill_at"] - (told["signalled_at"] + tier_timeout_s)) \
            <= SIGNAL_SLACK_S
        line = progress_line(doc, now=entry["signalled_at"])
        assert f"waiting on {stubborn} " in line
        assert f"SIGKILL in {tier_timeout_s:.1f}s" in line

        cli.communicate(timeout=120)
        assert cli.returncode == exit_codes.KILLED
    finally:
        if slave >= 0:
            os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    terminal = b"".join(written).decode(errors="replace")
    assert "SIGKILL in" in terminal, terminal
    assert all(len(line.rstrip("\r\n")) <= 79 for line in terminal.split("\r\x1b[K")), terminal

    summary = running.status()
    truth = assert_summary_is_true(summary, tree, root_code=tree.root.wait(timeout=30))
    assert truth[stubborn].fate == "killed"
    final = next(p for p in summary["processes"] if p["pid"] == stubborn)
    assert final["kill_at"] == entry["kill_at"]
    assert final["killed_at"] >= final["kill_at"] - 0.05
