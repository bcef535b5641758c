"""Handoffs migrated by the engine's own router need no acknowledgement from a router."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

CHILD = Path(__file__).with_name("engine_ack_child.py")
ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 3


def test_engine_migrated_handoffs_do_not_hold_the_migrating_phase(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with a 60 s budget (its migration deadline is far away) and an engine
       whose worker client reports handoffs as migrated by its own router
       (``handoff_ack="engine"``), holding 3 requests in flight; its event stream is open.
    2. POST /drain wait=false; nobody acknowledges anything.
    3. The engine hands the 3 back and reports them with its in-flight count 0.
    4. The drain ends done long before the migration deadline: terminating starts after
       the report, nothing was ever pending or expired, and migration_counts counts the 3
       handed back and acknowledged.
    5. A router that acknowledges one of them afterwards is told it is already settled."""
    coordinator = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    child = janitor.spawn([sys.executable, str(CHILD), coordinator.url, str(REQUESTS)],
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline() == b"serving\n"
    wait_for(lambda: any(w["connected"] for w in coordinator.status()["workers"]),
             what="event stream open")
    with coordinator.client() as client:
        started = client.post("/drain", json={"wait": False})
        assert started.status_code == 202
        assert child.stdout.readline() == b"handed back\n"
        summary: dict[str, Any] = client.get("/drain").json()
    assert summary["phase"] == "done", summary["timeline"]
    status = coordinator.status()
    assert status["migration_counts"] == {"handed_back": REQUESTS, "acked": REQUESTS,
                                          "expired": 0, "pending": 0, "early_acks": 0}
    terminating = next(t["at"] for t in summary["timeline"] if t["phase"] == "terminating")
    assert terminating < summary["drain"]["migration_deadline_at"], summary["timeline"]
    (worker,) = status["workers"]
    assert worker["state"] == "exited", worker
    wait_for(lambda: child.poll() is not None, what="the engine ended by the kill")
    with coordinator.client() as client:
        answer = client.post("/migrations/ack", json={"request_ids": ["e0"]}).json()
    assert answer["unknown"] == ["e0"], answer
