"""A coordinator SIGKILLed mid-drain resumes the drain from its state file."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import psutil

from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


def test_sigkill_mid_drain_then_restart_completes_the_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. register a tree whose two children ignore SIGTERM (tier timeout 4 s), with a
       state file;
    2. POST /drain wait=false; wait until the state file records that the kill signalled
       the stubborn children;
    3. SIGKILL the coordinator;
    4. start it again with the same state file: it resumes in terminating, with the same
       drain start (the budget still counts from it);
    5. GET /drain joins and answers done: every process of the tree listed exactly once,
       each with a final fate, the stubborn ones killed, and none left running."""
    state = tmp_path / "state.json"
    args = [*FAST, "--tier-timeout", "4", "--grace-period", "20", "--state-file", str(state)]
    first = start_coordinator(janitor, tmp_path, *args, name="first")
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1, stubborn=2)
    register(first, tree["pid"])
    with first.client() as client:
        started = client.post("/drain", json={"wait": False}).json()["drain"]

    def stubborn_signalled_on_disk() -> bool:
        document = json.loads(state.read_text())
        outcomes = (document.get("drain") or {}).get("outcomes", [])
        return sum(1 for o in outcomes if o["signal"] and o["fate"] == "running") >= 2

    wait_for(stubborn_signalled_on_disk, what="the stubborn children signalled, on disk")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)

    second = start_coordinator(janitor, tmp_path, *args, name="second")
    with second.client() as client:
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    assert summary["drain"]["started_at"] == started["started_at"]
    assert any(t["note"] == "resumed" for t in summary["timeline"])
    listed = Counter(p["pid"] for p in summary["processes"])
    assert set(listed) == set(tree["all"])
    assert set(listed.values()) == {1}
    fates = {p["pid"]: p["fate"] for p in summary["processes"]}
    assert "running" not in fates.values()
    assert [fates[pid] for pid in tree["children"][-2:]] == ["killed", "killed"]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in tree["all"])
