"""``shutdown-coordinator status --timeline FILE.svg``: the drain drawn to a file, as a real
command against a real coordinator after a real drain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from coordinator import exit_codes
from tests.service.servers import ROOT, Running
from tests.support.processes import ProcessJanitor
from tests.timeline.drains import TOKEN, drain_with_everything, start_next_cycle

SVG = "{http://www.w3.org/2000/svg}"


def status(running: Running, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    token = tmp / "client.token"
    token.write_text(TOKEN)
    return subprocess.run(
        [sys.executable, "-m", "coordinator", "status", "--url", running.url, "--token-file",
         str(token), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def rows_and_handoffs(path: Path) -> tuple[list[int], dict[str, list[float]]]:
    """The PIDs of the file's process rows, and the handoff lane's marks by kind."""
    root = ElementTree.fromstring(path.read_text(encoding="utf-8"))
    rows = [int(g.get("data-pid", "")) for g in root.iter(SVG + "g") if g.get("class") == "row"]
    marks: dict[str, list[float]] = {}
    for lane in root.iter(SVG + "g"):
        if lane.get("data-lane") == "handoffs":
            for mark in lane.iter():
                if mark.get("data-kind"):
                    marks.setdefault(mark.get("data-kind", ""), []).append(
                        float(mark.get("data-t", "")))
    return rows, marks


def test_status_timeline_writes_the_drain_and_then_the_last_one(janitor: ProcessJanitor,
                                                                tmp_path: Path) -> None:
    """1. a real drain of a 5-process tree with two handoffs acknowledged; 2. ``status
    --timeline`` writes an SVG with one row per process of the tree (the tree's own records)
    and both handoffs handed back and acknowledged; 3. a new engine registers (the drain
    becomes ``last_drain``): ``--timeline --last-drain`` draws that drain's processes, and so
    does ``--timeline`` alone while no drain runs (not the new engine)."""
    drained = drain_with_everything(janitor, tmp_path)
    tree = sorted(drained.tree.pids())
    svg = tmp_path / "drain.svg"
    done = status(drained.running, tmp_path, "--timeline", str(svg))
    assert done.returncode == exit_codes.OK, done.stderr
    assert done.stdout == ""
    assert str(svg) in done.stderr
    rows, handoffs = rows_and_handoffs(svg)
    assert sorted(rows) == tree
    assert len(handoffs.get("handed_back", [])) >= 1
    assert len(handoffs.get("acked", [])) == 2  # acknowledged one at a time
    assert not list(tmp_path.glob(".drain.svg.*"))

    engine = start_next_cycle(janitor, tmp_path, drained.running)
    try:
        last = tmp_path / "last.svg"
        answer = status(drained.running, tmp_path, "--timeline", str(last), "--last-drain")
        assert answer.returncode == exit_codes.OK, answer.stderr
        assert sorted(rows_and_handoffs(last)[0]) == tree
        # No drain runs: the latest one is what there is to draw, not the new engine.
        current = tmp_path / "current.svg"
        answer = status(drained.running, tmp_path, "--timeline", str(current))
        assert answer.returncode == exit_codes.OK, answer.stderr
        assert sorted(rows_and_handoffs(current)[0]) == tree
        assert engine.pid not in rows_and_handoffs(current)[0]
    finally:
        engine.root.terminate()
        engine.root.wait(timeout=30)


def test_status_timeline_says_what_is_wrong(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. ``--last-drain`` without ``--timeline``: a usage error, nothing asked; 2. after a
    drain, a file in a directory that does not exist: the error names the file, exit 2, no
    traceback; 3. a wrong token: exit 7."""
    from tests.service.servers import start_coordinator

    running = start_coordinator(janitor, tmp_path, token=TOKEN)
    alone = status(running, tmp_path, "--last-drain")
    assert alone.returncode == exit_codes.USAGE
    assert "--last-drain goes with --timeline" in alone.stderr
    with running.client() as client:  # a drain to draw (one that found nothing to drain)
        assert client.post("/drain", json={"wait": True}).status_code == 200
    missing = tmp_path / "no-such-dir" / "drain.svg"
    unwritable = status(running, tmp_path, "--timeline", str(missing))
    assert unwritable.returncode == exit_codes.USAGE
    assert f"cannot write {missing}" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token-at-all")
    refused = subprocess.run(
        [sys.executable, "-m", "coordinator", "status", "--url", running.url, "--token-file",
         str(wrong), "--timeline", str(tmp_path / "x.svg")], cwd=ROOT, capture_output=True,
        text=True, timeout=60)
    assert refused.returncode == exit_codes.AUTH_FAILED
    assert not (tmp_path / "x.svg").exists()
