"""One real drain with something of everything the timeline and the dashboard show: a
process that exits 0, one that exits 3, one that ignores SIGTERM (SIGKILLed), two handoffs
acknowledged at different times, a worker's ``shutdown_event``, and hostile strings in the
command lines and the worker's role."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kill.helpers import Tree, start_tree
from tests.service.servers import FAST, Running, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

TOKEN = "timeline-token-0123456789"
HOSTILE_ROLE = "<script>alert('role')</script>"
HOSTILE_NODE = "<img src=x onerror=alert(1)>&amp;'"
"""A tree node's role: it is in the command line of that node, which the page shows."""
HOSTILE_REQUEST = "</title><script>alert(2)</script>"
MAX_EARLY_ACKS = 1
"""Small, so a test can make the coordinator refuse one (a 429 counted by limit)."""
SPEC: dict[str, Any] = {"children": [
    {"role": HOSTILE_NODE, "children": [{}, {"ignore_term": True}]},
    {"exit_code": 3},
]}


@dataclass
class Drained:
    running: Running
    tree: Tree
    summary: dict[str, Any]
    """``GET /drain``'s answer: the ``/status`` document at ``done``."""
    notified_at: float
    metrics_during: str
    """``/metrics`` while the drain ran (its clock: elapsed and budget)."""


def drain_with_everything(janitor: ProcessJanitor, tmp: Path) -> Drained:
    """1. Start a coordinator with a token, a 1 s minimum drain and room for one early
       acknowledgement, and a tree of 5 processes; register its root as a worker with a
       hostile role.
    2. Start the drain (no wait) and read /metrics; while it is draining, report two
       handed-back requests and the time ``shutdown_event`` was set, then acknowledge
       them one at a time.
    3. ``GET /drain`` blocks until done; the root's exit code is reaped."""
    running = start_coordinator(janitor, tmp, *FAST, "--min-drain", "1",
                                "--max-early-acks", str(MAX_EARLY_ACKS), token=TOKEN)
    tree = start_tree(janitor, SPEC, tmp / "tree")
    worker = register(running, tree.pid, role=HOSTILE_ROLE)["id"]
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
        metrics_during = client.get("/metrics").text
        notified_at = time.time()
        answer = client.post(f"/workers/{worker}/report", json={
            "inflight": 0, "notified_at": notified_at,
            "handoffs": [{"request_id": "r-1", "tokens": 3},
                         {"request_id": HOSTILE_REQUEST, "tokens": 5}]})
        assert answer.status_code == 200, answer.text
        assert client.post("/migrations/ack", json={"request_ids": ["r-1"]}).json()["acked"] \
            == ["r-1"]
        assert client.post("/migrations/ack", json={"request_ids": [HOSTILE_REQUEST]}
                           ).json()["acked"] == [HOSTILE_REQUEST]
        summary = client.get("/drain").json()
    assert summary["phase"] == "done", summary
    tree.root.wait(timeout=30)
    return Drained(running, tree, summary, notified_at, metrics_during)


def start_next_cycle(janitor: ProcessJanitor, tmp: Path, running: Running) -> Tree:
    """Register a new engine: the finished drain becomes ``last_drain``, back to serving.
    The caller ends the returned tree."""
    engine = start_tree(janitor, {}, tmp / "next")
    register(running, engine.pid, role="next")
    wait_for(lambda: running.status()["phase"] == "serving", what="the next cycle")
    return engine
