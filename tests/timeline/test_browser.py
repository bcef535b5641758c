"""``GET /status/timeline`` in a real headless Chromium, after a real drain.

``TIMELINE_SCREENSHOT=docs/drain-timeline.png`` keeps the page's screenshot there (the one
the README shows); otherwise it goes to the test's temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import ProcessJanitor
from tests.timeline.browser import Browser, Page, chromium
from tests.timeline.drains import (
    HOSTILE_NODE,
    HOSTILE_REQUEST,
    HOSTILE_ROLE,
    drain_with_everything,
    start_next_cycle,
)

pytestmark = pytest.mark.skipif(chromium() is None,
                                reason="chromium is not installed (scripts/test.sh installs it)")

TOLERANCE_PX = 0.6
"""A mark's drawn centre may differ from the scale's x by the SVG's rounding (0.01) and
the browser's sub-pixel layout; a mark at the wrong time is off by far more."""

READ_DOM = """(() => {
  const svg = document.querySelector('svg.timeline');
  const box = svg.getBoundingClientRect();
  const centre = (el) => { const r = el.getBoundingClientRect(); return r.left + r.width / 2
                           - box.left; };
  return {
    scale: {...svg.dataset},
    marks: [...svg.querySelectorAll('[data-kind][data-t]')].map(m => ({
      kind: m.dataset.kind, t: m.dataset.t, pid: m.dataset.pid || null,
      count: m.dataset.count || null, x: centre(m)})),
    rows: [...svg.querySelectorAll('g.row')].map(g => ({
      pid: g.dataset.pid, tier: g.dataset.tier, fate: g.dataset.fate,
      title: g.querySelector('title').textContent})),
    bands: [...svg.querySelectorAll('rect.band')].map(b => ({phase: b.dataset.phase,
                                                            t: b.dataset.t})),
    scripts: document.scripts.length, images: document.images.length,
    iframes: document.querySelectorAll('iframe, object, embed').length,
    table: [...document.querySelectorAll('tbody tr')].map(r => r.dataset.pid),
    text: document.body.innerText,
  };
})()"""


def expected_x(scale: dict[str, str], t: float) -> float:
    """``coordinator.timeline.scale``: x = x0 + (t - t0) * width / (t1 - t0)."""
    t0, t1 = float(scale["t0"]), float(scale["t1"])
    return float(scale["x0"]) + (t - t0) * float(scale["width"]) / (t1 - t0)


def check_page(page: Page, url: str, summary: dict[str, Any],
               notified_at: float | None) -> None:
    """What every timeline page of ``summary``'s drain must show, read from the DOM
    (``notified_at``: the worker's shutdown_event, None once the worker is forgotten)."""
    assert page.errors() == []
    assert page.requests() == [url], "the page loaded something besides itself"
    dom = page.evaluate(READ_DOM)
    processes = {p["pid"]: p for p in summary["processes"]}
    # Every process of the drain has its row, with its tier and fate.
    assert sorted(int(r["pid"]) for r in dom["rows"]) == sorted(processes)
    for row in dom["rows"]:
        process = processes[int(row["pid"])]
        assert (row["tier"], row["fate"]) == (process["tier"], process["fate"])
    assert sorted(int(pid) for pid in dom["table"]) == sorted(processes)
    # Every mark sits at its recorded time, and every recorded time has its mark.
    marks = dom["marks"]
    for mark in marks:
        assert abs(mark["x"] - expected_x(dom["scale"], float(mark["t"]))) <= TOLERANCE_PX, mark
    for pid, process in processes.items():
        drawn = {m["kind"]: float(m["t"]) for m in marks if m["pid"] == str(pid)}
        for kind, key in (("term", "signalled_at"), ("kill", "killed_at"), ("exit", "ended_at")):
            assert drawn.get(kind) == process[key], (pid, kind, drawn, process)
    # The phases as bands, from the drain's own transitions.
    drain = summary["drain"]
    phases = [(t["phase"], t["at"]) for t in summary["timeline"]
              if t["at"] >= drain["started_at"] - 0.001 and t["phase"] != "serving"]
    assert [(b["phase"], float(b["t"])) for b in dom["bands"]] == phases
    assert [p for p, _ in phases] == ["draining", "migrating", "terminating", "done"]
    # Handoffs: two handed back, two acknowledged apart; the worker's shutdown_event.
    def count(kind: str) -> int:
        return sum(int(m["count"] or 1) for m in marks if m["kind"] == kind)
    assert (count("handed_back"), count("acked"), count("expired")) == (2, 2, 0)
    assert [float(m["t"]) for m in marks if m["kind"] == "notified"] == \
        ([notified_at] if notified_at is not None else [])
    # Hostile strings are text, never markup.
    assert (dom["scripts"], dom["images"], dom["iframes"]) == (0, 0, 0)
    assert HOSTILE_NODE in dom["text"]
    assert any(HOSTILE_NODE in row["title"] for row in dom["rows"])


def test_timeline_page_in_chromium_shows_the_drain_as_recorded(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A real drain (tests/timeline/drains.py): 5 processes, one SIGKILLed, one exiting 3,
       two handoffs acknowledged, a worker's shutdown_event; hostile role and command line.
    2. /status/timeline: 401 without the token, 422 for a bad ``drain`` or ``format``;
       ``format=svg`` is SVG.
    3. Chromium loads the page with the token: no console error, no request but the page;
       a row per process, each mark at its recorded time (the scale recomputed from the
       DOM against where the browser drew it), the four phases as bands, the handoffs and
       the shutdown_event; the hostile strings shown as text. A screenshot is kept.
    4. A new worker starts the next cycle: the page (``current``, and ``drain=last``) still
       shows the finished drain, checked the same way (its worker forgotten with the
       cycle, so without the shutdown_event mark)."""
    drained = drain_with_everything(janitor, tmp_path)
    running, summary = drained.running, drained.summary
    url = running.url + "/status/timeline"
    assert httpx.get(url, timeout=30).status_code == 401
    with running.client() as client:
        assert client.get(url, params={"drain": "previous"}).status_code == 422
        assert client.get(url, params={"format": "png"}).status_code == 422
        svg = client.get(url, params={"format": "svg"})
        assert svg.headers["content-type"].startswith("image/svg+xml")
        page_answer = client.get(url)
        assert page_answer.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page_answer.headers["content-security-policy"]
    assert HOSTILE_ROLE not in page_answer.text
    assert HOSTILE_REQUEST not in page_answer.text

    browser = Browser(janitor, tmp_path / "profile")
    try:
        page = browser.open(url, running.headers)
        check_page(page, url, summary, drained.notified_at)
        shot = page.screenshot()
        assert shot.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(shot) > 10_000
        target = Path(os.environ.get("TIMELINE_SCREENSHOT") or tmp_path / "timeline.png")
        target.write_bytes(shot)

        engine = start_next_cycle(janitor, tmp_path, running)
        try:
            for view in (url, url + "?drain=last"):
                again = browser.open(view, running.headers)
                check_page(again, view, summary, None)
                assert "Last drain" in again.evaluate("document.body.innerText")
        finally:
            engine.end()
    finally:
        browser.close()
