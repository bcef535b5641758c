"""``state_bounds.fit``: a state document is never larger than its reader accepts; what is
left out to make it fit is the least a resumed drain needs, in order, and said."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.drain.state_bounds import StateTooLarge, fit
from coordinator.drain.state_file import parse_state


def document(handoffs: int = 0, detail: str = "", cmdline: str = "x",
             timeline: int = 3, processes: int = 2) -> dict[str, Any]:
    outcomes = [{"pid": 100 + n, "name": "p", "fate": "running", "cmdline": cmdline,
                 "detail": ""} for n in range(processes)]
    drain = {"reason": "r", "started_at": 1.0, "budget_s": 25.0, "migration_s": 13.0,
             "termination_s": 12.0, "outcomes": outcomes}
    return {
        "version": 1, "phase": "migrating", "generation": 9,
        "timeline": [{"phase": "serving", "at": 1.0, "generation": n} for n in range(timeline)],
        "drain": drain, "last": {**drain, "outcomes": list(outcomes)},
        "workers": [{"id": "w", "pid": 100, "start_time": 1.0, "role": "worker",
                     "tiers": [{"name": "t", "signal": 15, "timeout_s": 1.0}]}],
        "migrations": {"pending": [{"request_id": f"r{n}", "worker": "w", "tokens": n,
                                    "handed_back_at": 1.0, "detail": detail}
                                   for n in range(handoffs)]},
    }


def test_a_document_that_fits_is_written_whole() -> None:
    data, dropped = fit(document(handoffs=3, detail="d"), limit=10_000)
    assert dropped == {}
    assert json.loads(data) == document(handoffs=3, detail="d")


def test_handoff_details_go_first_and_the_document_stays_restorable() -> None:
    """1,200 handoffs with 16 KB details against a 1 MiB limit: only the details go, each
    handoff stays with its tokens and worker, and the reader restores the result."""
    whole = document(handoffs=1200, detail="d" * 16_000)
    data, dropped = fit(whole, limit=2**20)
    assert len(data) <= 2**20
    assert dropped == {"handoff_details": 1200}
    kept = json.loads(data)
    assert kept["dropped"] == dropped
    assert [m["tokens"] for m in kept["migrations"]["pending"]] == list(range(1200))
    assert kept["workers"] == whole["workers"]
    assert kept["drain"] == whole["drain"]
    assert whole["migrations"]["pending"][0]["detail"]  # the caller's copy is untouched
    parse_state(data, now=2.0)


def test_later_steps_only_when_the_earlier_ones_were_not_enough() -> None:
    """Long command lines, the last drain's processes, the timeline: in that order, each
    only while the document is still too large."""
    whole = document(cmdline="c" * 50_000, processes=4, timeline=40)
    data, dropped = fit(whole, limit=60_000)
    assert list(dropped) == ["command_lines_cut"]
    assert len(data) <= 60_000
    data, dropped = fit(document(cmdline="c" * 1000, processes=40, timeline=400),
                        limit=30_000)
    assert list(dropped) == ["command_lines_cut", "last_drain_processes", "timeline_entries"]
    assert len(data) <= 30_000
    assert len(json.loads(data)["drain"]["outcomes"]) == 40


def test_a_document_that_cannot_fit_is_not_written() -> None:
    with pytest.raises(StateTooLarge, match="more than the 500 its reader accepts"):
        fit(document(processes=50), limit=500)
