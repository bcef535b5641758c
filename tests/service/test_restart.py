"""Restarts on the state file: a coordinator SIGKILLed mid-drain resumes the drain; a done
drain ends its cycle; an unusable file is set aside; failed writes show and the drain goes
on."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from devstack.routers import free_port
from devstack.sim.launcher import start_engine
from tests.service.servers import FAST, Running, register, start_coordinator
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


# --- the state file cannot trap the host ----------------------------------------------------


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot, from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def ended(pid: int, ticks: int) -> bool:
    """Per ``/proc``: the process that started at ``ticks`` no longer runs (gone, a zombie
    waiting for its parent, or its PID now names another process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    fields = stat[stat.rindex(b")") + 2:].split()
    return fields[0] in (b"Z", b"X") or int(fields[19]) != ticks


def ready(running: Running) -> int:
    return httpx.get(running.url + "/readyz", timeout=10).status_code


def metric(running: Running, name: str) -> float:
    text = httpx.get(running.url + "/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ") or line.startswith(name + "{")]
    return sum(values)


def stop_with_sigterm(running: Running) -> None:
    """SIGTERM ends the coordinator with exit 0."""
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=30) == 0, running.log.read_text()


def finished_drain(janitor: ProcessJanitor, tmp_path: Path, state: Path) -> dict[str, Any]:
    """Run one drain of a small tree to done on a coordinator with ``state``, stop that
    coordinator (exit 0) and return the drain's summary."""
    first = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state),
                              name="first")
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=1)
    register(first, tree["pid"])
    with first.client() as client:
        summary: dict[str, Any] = client.get("/drain").json()
    assert summary["phase"] == "done"
    stop_with_sigterm(first)
    assert json.loads(state.read_text())["phase"] == "done"
    return summary


def test_restart_after_a_done_drain_whose_processes_are_gone_serves_again(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. drain a tree to done, stop the coordinator (the state file says done);
    2. start it again on the same file: serving, /readyz 200, the drain as last_drain;
    3. a new engine registers (201) and a new drain ends it: the cycle works again;
    4. SIGTERM: exit 0."""
    state = tmp_path / "state" / "drain.json"
    summary = finished_drain(janitor, tmp_path, state)
    second = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state),
                               name="second")
    assert ready(second) == 200
    status = second.status()
    assert status["phase"] == "serving"
    assert status["drain"] is None
    assert status["last_drain"]["started_at"] == summary["drain"]["started_at"]
    assert status["last_drain"]["outcome"] == summary["outcome"]
    assert status["workers"] == []
    assert status["state_file"]["loaded"] == {"result": "restored", "phase": "done",
                                              "problem": None, "moved_to": None}
    assert "restarted" in status["timeline"][-1]["note"]
    tree = start_tree(janitor, tmp_path, children=1, grandchildren=0, tag="next")
    ticks = {pid: start_ticks(pid) for pid in tree["all"]}
    register(second, tree["pid"])
    with second.client() as client:
        again = client.get("/drain").json()
    assert again["phase"] == "done"
    assert again["drain"]["started_at"] > summary["drain"]["started_at"]
    assert {p["pid"] for p in again["processes"]} == set(tree["all"])
    assert all(ended(pid, t) for pid, t in ticks.items())
    stop_with_sigterm(second)


def test_a_registration_while_done_starts_the_next_cycle(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. drain a tree to done (no restart); DELETE /drain is still refused (409);
    2. a new engine registers: 201, phase serving, /readyz 200, the finished drain as
       last_drain, the old worker forgotten; 3. GET /drain runs a new drain of the new tree."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    old = start_tree(janitor, tmp_path, children=1, grandchildren=0, tag="old")
    register(running, old["pid"])
    with running.client() as client:
        first = client.get("/drain").json()
        assert first["phase"] == "done"
        assert client.delete("/drain").status_code == 409
        new = start_tree(janitor, tmp_path, children=1, grandchildren=0, tag="new")
        answer = client.post("/workers", json={"pid": new["pid"]})
        assert answer.status_code == 201, answer.text
        assert answer.json()["phase"] == "serving"
        assert ready(running) == 200
        status = client.get("/status").json()
        assert status["last_drain"]["started_at"] == first["drain"]["started_at"]
        assert [w["pid"] for w in status["workers"]] == [new["pid"]]
        assert status["workers"][0]["state"] == "serving"
        second = client.get("/drain").json()
    assert second["phase"] == "done"
    assert {p["pid"] for p in second["processes"]} == set(new["all"])
    stop_with_sigterm(running)


def test_done_with_a_process_still_running_waits_for_a_new_worker(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a done state file whose drain lists a process that still runs (``survived``);
    2. a restart stays done (/readyz 503) and GET /drain answers that drain;
    3. the survivor itself cannot register (409); 4. a new engine can: the next cycle starts,
       and the timeline names the survivor."""
    state = tmp_path / "drain.json"
    finished_drain(janitor, tmp_path, state)
    survivor = janitor.spawn(["sleep", "1000"], service=True, exit_code=-signal.SIGTERM)
    document = json.loads(state.read_text())
    document["drain"]["outcomes"].append(
        {"pid": survivor.pid, "name": "sleep", "fate": "survived",
         "start_time": psutil.Process(survivor.pid).create_time()})
    state.write_text(json.dumps(document))
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state),
                                name="second")
    assert ready(running) == 503
    with running.client() as client:
        assert client.get("/drain").json()["drain"]["started_at"] == \
            document["drain"]["started_at"]
        refused = client.post("/workers", json={"pid": survivor.pid})
        assert refused.status_code == 409
        assert "finished drain" in refused.json()["detail"]
        new = start_tree(janitor, tmp_path, children=0, grandchildren=0, tag="new")
        janitor.service(new["pid"])  # scenery: a registered engine nothing drains
        assert client.post("/workers", json={"pid": new["pid"]}).status_code == 201
    status = running.status()
    assert status["phase"] == "serving"
    assert str(survivor.pid) in status["timeline"][-1]["note"]
    stop_with_sigterm(running)


HALF_WRITTEN = b'{"version":1,"phase":"migrating","drain":{"reason":"x"}}'
CORRUPT: dict[str, bytes | None] = {
    "a list": b"[]",
    "not utf-8": b'{"version":1,"phase":"\xff"}',
    "not json": b'{"version":1,"pha',
    "unknown version": b'{"version":2,"phase":"serving"}',
    "wrong types": b'{"version":1,"phase":"done","generation":"7","timeline":{},'
                   b'"drain":[],"workers":7,"migrations":null}',
    "half-written": HALF_WRITTEN,
    "a directory": None,
}


@pytest.mark.parametrize("kind", CORRUPT, ids=list(CORRUPT))
def test_a_corrupt_state_file_is_set_aside_and_the_coordinator_serves(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. the state file is unusable (see CORRUPT; None: a directory at the path);
    2. the coordinator starts, serves (/readyz 200), shows where the file went;
    3. the file is moved to <path>.corrupt-<UTC time>, content intact, and a fresh valid
       state replaces it; 4. SIGTERM right away: exit 0."""
    state = tmp_path / "drain.json"
    content = CORRUPT[kind]
    if content is None:
        (state / "leftover").mkdir(parents=True)
    else:
        state.write_bytes(content)
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state))
    assert ready(running) == 200
    status = running.status()
    assert status["phase"] == "serving"
    loaded = status["state_file"]["loaded"]
    assert loaded["result"] == "set_aside"
    assert loaded["problem"]
    aside = sorted(tmp_path.glob("drain.json.corrupt-*"))
    assert [str(p) for p in aside] == [loaded["moved_to"]]
    if content is None:
        assert (aside[0] / "leftover").is_dir()
    else:
        assert aside[0].read_bytes() == content
    assert json.loads(state.read_text())["phase"] == "serving"
    assert metric(running, "shutdown_coordinator_state_files_unusable_total") == 1
    stop_with_sigterm(running)


def test_an_unreadable_state_path_shows_in_status_and_the_coordinator_serves(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """The state file's directory is a regular file: nothing can be read, moved or
    written; the coordinator serves, and /status and /metrics say so."""
    (tmp_path / "blocker").write_text("not a directory")
    state = tmp_path / "blocker" / "drain.json"
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state))
    assert ready(running) == 200
    document = running.status()["state_file"]
    assert document["loaded"]["result"] == "unusable"
    assert document["path"] == str(state)
    assert (document["ok"], document["writes"]) == (False, 0)
    assert document["failures"] >= 1
    assert document["last_error"]
    assert metric(running, "shutdown_coordinator_state_write_failures_total") >= 1
    stop_with_sigterm(running)


def test_failing_writes_show_and_the_drain_still_ends_its_processes(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator with a working state file, a registered tree;
    2. the state file's path becomes a directory: every later write fails;
    3. GET /drain: done, every process of the tree ended (per /proc);
    4. /status state_file and /metrics show the failures; SIGTERM: exit 0."""
    state = tmp_path / "drain.json"
    running = start_coordinator(janitor, tmp_path, *FAST, "--state-file", str(state))
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=1)
    ticks = {pid: start_ticks(pid) for pid in tree["all"]}
    register(running, tree["pid"])
    wait_for(state.exists, what="the first write")

    def replace_with_directory() -> bool:
        try:
            state.unlink(missing_ok=True)
            state.mkdir()
        except FileExistsError:  # a write landed in between: again
            return False
        return True

    wait_for(replace_with_directory, what="the state path taken by a directory")
    with running.client() as client:
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    assert {p["pid"] for p in summary["processes"]} == set(tree["all"])
    assert all(ended(pid, t) for pid, t in ticks.items())
    document = running.status()["state_file"]
    assert document["ok"] is False
    assert document["failures"] >= 1
    assert "IsADirectoryError" in document["last_error"]
    assert document["last_write_at"] is not None
    assert metric(running, "shutdown_coordinator_state_write_failures_total") >= 1
    assert state.is_dir()
    stop_with_sigterm(running)


def test_a_restart_mid_drain_waits_for_the_worker_to_hear_of_it_again(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a simulated engine registered through worker_client, whose main process SIGKILLs
    its whole tree when a child dies unless its pre-kill hook stood that watchdog down;
    2. a drain held in draining (``--min-drain 3``), the coordinator SIGKILLed there (its
    state file says draining), then started again on the same port and state file;
    3. the resumed drain waits for the worker to connect again before it goes on, so the
    worker's pre-kill hook runs before its children are signalled: every process finishes
    its cleanup and exits 0 (their own records, the main process's wait status) and the
    summary is graceful. (Without the wait, the kill could start while the worker was still
    reconnecting: a child's SIGTERM then trips the watchdog and the tree dies of SIGKILL.)"""
    state = tmp_path / "state.json"
    port = str(free_port())
    args = [*FAST, "--port", port, "--min-drain", "3", "--state-file", str(state)]
    first = start_coordinator(janitor, tmp_path, *args, name="first")
    engine = start_engine(janitor.spawn, tmp_path / "records", schedulers=2, watchdog=True,
                          graceful_main=True, teardown_s=0.1, coordinator=first.url)
    wait_for(lambda: any(w["pid"] == engine.pid and w["connected"]
                         for w in first.status()["workers"]), what="the engine connected")
    with first.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    wait_for(lambda: json.loads(state.read_text())["phase"] == "draining",
             what="draining, on disk")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)

    second = start_coordinator(janitor, tmp_path, *args, name="second")
    with second.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.proc.wait(timeout=60) == 0
    records = {r["pid"]: r for r in engine.records()}
    assert sorted(records) == sorted(p.pid for p in engine.processes)
    assert {(r["cleanup"], r["exit_code"]) for r in records.values()} == {("finished", 0)}
    assert any(t["note"] == "resumed" for t in summary["timeline"])
    assert summary["outcome"] == "graceful", summary["drain"]["causes"]
    assert not [pid for pid in records if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != "zombie"]
