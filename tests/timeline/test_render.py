"""The renderer as pure functions: SVG and HTML from /status documents, parsed back."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from coordinator.timeline import Scale, render_html, render_svg, write_svg
from coordinator.timeline.layout import COLLAPSE_AFTER
from coordinator.timeline.page import MAX_LISTED

SVG = "{http://www.w3.org/2000/svg}"
T = 1_800_000_000.0
HOSTILE = "</title><script>alert(1)</script>\x00\x1b[31m\ud800 \"quoted\" & 'single' ]]>"


def process(pid: int, tier: str, depth: int, fate: str = "exited", **times: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "pid": pid, "name": "python", "cmdline": f"python -m engine {pid}", "role": None,
        "root_pid": 100, "parent_pid": 99, "depth": depth, "fate": fate, "exit_code": 0,
        "signal": "SIGTERM", "tier": tier, "elapsed_ms": 1.0, "detail": "",
        "signalled_at": None, "kill_at": None, "killed_at": None, "ended_at": None}
    entry.update(times)
    return entry


def document(processes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "phase": "done",
        "drain": {"reason": "preStop", "started_at": T, "deadline_at": T + 25,
                  "migration_deadline_at": T + 13, "ended_at": T + 4, "outcome": "killed",
                  "causes": ["one was killed"], "lost_requests": 0, "force": False},
        "timeline": [{"phase": "serving", "at": T - 100, "generation": 1, "note": "started"},
                     {"phase": "draining", "at": T, "generation": 2, "note": "preStop"},
                     {"phase": "migrating", "at": T + 0.5, "generation": 3, "note": ""},
                     {"phase": "terminating", "at": T + 1, "generation": 4, "note": ""},
                     {"phase": "done", "at": T + 4, "generation": 9, "note": "killed"}],
        "workers": [{"id": "w-1", "pid": 100, "role": "worker", "state": "exited",
                     "pushed_at": T + 0.001, "notified_at": T + 0.002}],
        "migrations": [], "migration_counts": {"handed_back": 0, "acked": 0, "expired": 0},
        "processes": processes, **extra}


def parse(svg_text: str) -> ET.Element:
    return ET.fromstring(svg_text)


def x_of(root: ET.Element, t: float) -> float:
    scale = Scale(float(root.get("data-t0", "")), float(root.get("data-t1", "")),
                  float(root.get("data-x0", "")), float(root.get("data-width", "")))
    return scale.x(t)


def centre(mark: ET.Element) -> float:
    """Where a mark is drawn: a circle's cx, a line's x1, a path's mid x."""
    if mark.tag == SVG + "circle":
        return float(mark.get("cx", ""))
    if mark.tag == SVG + "line":
        return float(mark.get("x1", ""))
    xs = [float(part.split(",")[0]) for part in
          mark.get("d", "").replace("M", " ").replace("L", " ").replace("Z", " ").split()]
    return (min(xs) + max(xs)) / 2


def test_write_svg_draws_one_row_per_process_with_marks_at_their_times(tmp_path: Path) -> None:
    """1. A drain of 4 processes in 3 tiers (one SIGKILLed, one exiting 3, one gone).
    2. ``write_svg`` writes a file that parses as XML: one row per process, in the kill's
       order (deepest tier first, the root last), each mark centred on the scale's x of
       its recorded time, and no mark for a time that was not recorded."""
    processes = [
        process(100, "roots", 0, signalled_at=T + 3, kill_at=T + 5, ended_at=T + 3.5),
        process(101, "depth-1", 1, exit_code=3, signalled_at=T + 2.5, ended_at=T + 2.6),
        process(102, "depth-2", 2, "killed", exit_code=-9, signalled_at=T + 1,
                kill_at=T + 2, killed_at=T + 2, ended_at=T + 2.01),
        process(103, "depth-2", 2, "gone", exit_code=None),
    ]
    path = tmp_path / "drain.svg"
    write_svg(document(processes), path)
    root = parse(path.read_text(encoding="utf-8"))
    rows = [g for g in root.iter(SVG + "g") if g.get("class") == "row"]
    assert [int(g.get("data-pid", "")) for g in rows] == [102, 103, 101, 100]
    for entry in processes:
        row = next(g for g in rows if g.get("data-pid") == str(entry["pid"]))
        marks = {m.get("data-kind"): m for m in row if m.get("data-kind")}
        for kind, key in (("term", "signalled_at"), ("kill", "killed_at"), ("exit", "ended_at")):
            if entry[key] is None:
                assert kind not in marks
                continue
            assert float(marks[kind].get("data-t", "")) == entry[key]
            assert abs(centre(marks[kind]) - x_of(root, entry[key])) <= 0.01
    assert [b.get("data-phase") for b in root.iter(SVG + "rect")
            if b.get("class", "").startswith("band")] == ["draining", "migrating",
                                                          "terminating", "done"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_hostile_strings_are_text_in_svg_and_html() -> None:
    """1. Every string of the document (name, command line, detail, role, tier, reason,
       cause, worker id) holds markup, control characters, a lone surrogate and quotes.
    2. The SVG parses as XML with no element but SVG's own (no script); the HTML has no
       ``<script`` at all; the text survives, escaped, minus what XML forbids."""
    entry = process(100, HOSTILE, 0, signalled_at=T + 1, ended_at=T + 2)
    entry.update(name=HOSTILE, cmdline=HOSTILE, detail=HOSTILE, role=HOSTILE, fate=HOSTILE)
    doc = document([entry])
    doc["drain"].update(reason=HOSTILE, causes=[HOSTILE])
    doc["workers"][0].update(id=HOSTILE, role=HOSTILE, state=HOSTILE)
    doc["migrations"] = [{"request_id": HOSTILE, "handed_back_at": T + 0.2, "tokens": 1}]
    svg_text = render_svg(doc)
    root = parse(svg_text)
    tags = {element.tag.removeprefix(SVG) for element in root.iter()}
    assert tags <= {"svg", "g", "rect", "text", "title", "style", "line", "path", "circle"}
    html = render_html(doc)
    assert "<script" not in html.lower()
    assert "<script" not in svg_text.lower()
    assert "&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html
    titles = " ".join(t.text or "" for t in root.iter(SVG + "title"))
    assert "</title><script>alert(1)</script>" in titles


@pytest.mark.parametrize("bad", [None, [], "text", {"drain": "x", "processes": "y"},
                                 {"processes": [{"pid": "1"}, {"pid": True}, 5]},
                                 {"drain": {"started_at": float("nan")}, "timeline": [{}]}])
def test_damaged_documents_still_draw(bad: Any) -> None:
    """A document of the wrong shape draws what it can, never raises."""
    parse(render_svg(bad))
    assert render_html(bad).startswith("<!DOCTYPE html>")


def test_two_thousand_processes_collapse_by_tier_and_stay_bounded() -> None:
    """1. 2,000 processes in 3 tiers (over ``COLLAPSE_AFTER``).
    2. The SVG has no per-process row but one row per tier, whose counts add up to 2,000
       and whose marks stand for every signal and exit (``data-count``); the HTML table
       lists every process; both stay under a few MB."""
    processes = [process(1000 + i, f"depth-{1 + i % 3}", 1 + i % 3, signalled_at=T + 1 + i % 3,
                         ended_at=T + 1.5 + (i % 300) / 100) for i in range(2000)]
    svg_text = render_svg(document(processes))
    root = parse(svg_text)
    assert root.get("data-collapsed") == "true"
    assert len(processes) > COLLAPSE_AFTER
    tiers = [g for g in root.iter(SVG + "g") if g.get("class") == "tier-row"]
    assert not [g for g in root.iter(SVG + "g") if g.get("class") == "row"]
    assert sorted(g.get("data-tier", "") for g in tiers) == ["depth-1", "depth-2", "depth-3"]
    assert sum(int(g.get("data-count", "")) for g in tiers) == 2000
    for kind in ("term", "exit"):
        assert sum(int(m.get("data-count", "")) for g in tiers for m in g
                   if m.get("data-kind") == kind) == 2000
    html = render_html(document(processes))
    assert html.count("<tr class=") == min(2000, MAX_LISTED)
    assert len(svg_text) < 500_000
    assert len(html) < 4_000_000


def test_no_drain_yet_draws_the_known_processes() -> None:
    """Serving, never drained: the processes the scan lists, without marks."""
    doc = {"phase": "serving", "drain": None, "last_drain": None, "timeline": [],
           "processes": [process(7, "", 0, "running")]}
    root = parse(render_svg(doc))
    assert [g.get("data-pid") for g in root.iter(SVG + "g") if g.get("class") == "row"] == ["7"]
    assert "No drain yet" in render_html(doc)
    json.dumps(doc)  # the document itself stays JSON
