"""The state file is one coordinator's and nobody else's: a second coordinator on it refuses
to start, a file (or directory) another user could write is refused before anything is
read, a document is never written larger than its reader accepts, and a restored tier
pattern that does not compile cannot stop the kill.

Ground truth: the processes the file names (``/proc``), the file's bytes and size on disk,
the coordinators' exit codes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from coordinator import exit_codes
from coordinator.drain.state_bounds import MAX_STATE_BYTES
from tests.service.servers import FAST, ROOT, Running, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.neighbour import alive, neighbour
from tests.support.processes import ProcessJanitor, wait_for

DETAIL = "d" * 16_000
"""A handoff's detail near its bound (16 KiB): 1,200 of them are 19 MB."""


def serve_once(janitor: ProcessJanitor, tmp_path: Path, state: Path,
               *args: str) -> subprocess.CompletedProcess[str]:
    """``serve`` on ``state`` expected to refuse at once: its exit code and output."""
    proc = janitor.spawn_python(
        ["-m", "coordinator", "serve", "--port", "0", "--state-file", str(state), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def held_drain(janitor: ProcessJanitor, tmp_path: Path, state: Path,
               *args: str) -> tuple[Running, int, str]:
    """A coordinator on ``state`` whose drain holds in ``migrating`` (its worker, a root
    ``sleep``, reports 1 in flight); (the coordinator, the sleeper, the worker's id)."""
    first = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "120",
                              "--state-file", str(state), *args, name="first")
    sleeper = janitor.spawn(["sleep", "600"], cwd="/", service=True,
                            exit_code=-signal.SIGTERM).pid
    worker = register(first, sleeper)["id"]
    with first.client() as client:
        assert client.post(f"/workers/{worker}/report", json={"inflight": 1}).status_code == 200
        assert client.post("/drain", json={"wait": False}).status_code == 202
    wait_for(lambda: json.loads(state.read_text())["phase"] == "migrating" or None,
             what="the drain migrating, on disk")
    return first, sleeper, worker


def sigkill(running: Running) -> None:
    running.proc.send_signal(signal.SIGKILL)
    running.proc.wait(timeout=30)


def test_a_second_coordinator_on_the_same_state_file_refuses_to_start(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator on ``drain.json``; 2. a second ``serve`` on the same file exits
       ``STATE_FILE_LOCKED`` (15), naming the first's PID, without listening; 3. the first
       still serves and still holds the lock (its PID in the lock file)."""
    state = tmp_path / "state" / "drain.json"
    first = start_coordinator(janitor, tmp_path, "--state-file", str(state), name="first")
    second = serve_once(janitor, tmp_path, state)
    assert second.returncode == exit_codes.STATE_FILE_LOCKED, second.stdout
    assert f"pid {first.proc.pid}" in second.stdout
    assert "listening" not in second.stdout
    assert httpx.get(first.url + "/healthz", timeout=30).status_code == 200
    assert (state.parent / "drain.json.lock").read_text().strip() == str(first.proc.pid)


def test_a_state_file_another_user_could_write_is_refused(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a drain held in ``migrating`` on a state file naming a root sleeper; the
       coordinator is SIGKILLed; 2. the file given to an unprivileged user, its directory
       made world-writable, the file made group-writable, a symlink in its place: each time
       ``serve`` exits ``STATE_FILE_UNSAFE`` (16) saying what to fix, and the sleeper was
       never signalled (per /proc); 3. with the file and directory back to root's alone the
       coordinator resumes the drain (``migrating``, ``/readyz`` 503)."""
    user = neighbour(janitor)
    directory = tmp_path / "state"
    state = directory / "drain.json"
    first, sleeper, _ = held_drain(janitor, tmp_path, state)
    sigkill(first)
    original = state.read_bytes()

    cases: list[tuple[str, Any, Any]] = [
        ("belongs to UID", lambda: os.chown(state, user.uid, user.gid),
         lambda: os.chown(state, 0, 0)),
        ("writable by every user", lambda: directory.chmod(0o777),
         lambda: directory.chmod(0o700)),
        ("writable by its group", lambda: state.chmod(0o660), lambda: state.chmod(0o600)),
    ]
    for words, spoil, mend in cases:
        spoil()
        refused = serve_once(janitor, tmp_path, state)
        assert refused.returncode == exit_codes.STATE_FILE_UNSAFE, (words, refused.stdout)
        assert words in refused.stdout
        assert alive(sleeper)
        assert state.read_bytes() == original
        mend()
    link = directory / "elsewhere.json"
    state.rename(link)
    state.symlink_to(link)
    refused = serve_once(janitor, tmp_path, state)
    assert refused.returncode == exit_codes.STATE_FILE_UNSAFE, refused.stdout
    assert "symbolic link" in refused.stdout
    state.unlink()
    link.rename(state)

    second = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "120",
                               "--state-file", str(state), name="second")
    assert second.status()["phase"] == "migrating"
    assert httpx.get(second.url + "/readyz", timeout=30).status_code == 503
    with second.client() as client:
        assert client.delete("/drain").status_code == 200
    assert alive(sleeper)


def test_an_oversized_document_is_cut_to_fit_and_a_restart_resumes_the_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a drain held in ``migrating``; its worker hands back 1,200 requests with 16 KB
       details each (19 MB of JSON); 2. the file on disk stays within what the reader
       accepts, and ``/status`` ``state_file`` says the details were left out (and the
       handoffs in memory keep theirs); 3. the coordinator is SIGKILLed and started again
       on the file: it resumes the drain (``migrating``, ``/readyz`` 503), with all 1,200
       handoffs pending (details null), the worker a kill target, and says what the file
       left out."""
    state = tmp_path / "state" / "drain.json"
    first, sleeper, worker = held_drain(janitor, tmp_path, state)
    with first.client() as client:
        for start in range(0, 1200, 300):
            handoffs = [{"request_id": f"r-{n}", "tokens": n, "detail": DETAIL}
                        for n in range(start, start + 300)]
            answer = client.post(f"/workers/{worker}/report",
                                 json={"inflight": 1, "handoffs": handoffs})
            assert answer.status_code == 200, answer.text

    def written_with_drops() -> dict[str, Any] | None:
        found: dict[str, Any] = first.status()["state_file"]
        return found if found["ok"] and found["dropped"].get("handoff_details") == 1200 \
            and json.loads(state.read_bytes()).get("dropped") else None

    wait_for(written_with_drops, what="the state file written without the details")
    assert state.stat().st_size <= MAX_STATE_BYTES
    on_disk = json.loads(state.read_bytes())
    assert len(on_disk["migrations"]["pending"]) == 1200
    assert {m["detail"] for m in on_disk["migrations"]["pending"]} == {None}
    assert {m["detail"] for m in first.status()["migrations"]} == {DETAIL}
    sigkill(first)

    second = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "120",
                               "--state-file", str(state), name="second")
    document = second.status()
    assert document["phase"] == "migrating"
    assert httpx.get(second.url + "/readyz", timeout=30).status_code == 503
    loaded = document["state_file"]["loaded"]
    assert loaded["result"] == "restored"
    assert loaded["dropped"]["handoff_details"] == 1200
    assert len(document["migrations"]) == 1200
    assert [w["pid"] for w in document["workers"]] == [sleeper]
    with second.client() as client:
        plan = client.get("/plan").json()
        assert sleeper in {p["pid"] for t in plan["tiers"] for p in t["processes"]}
        assert client.delete("/drain").status_code == 200


def test_a_restored_tier_pattern_that_does_not_compile_cannot_stop_the_kill(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree registered with a tier matching its children; a drain held in
       ``migrating``; the coordinator SIGKILLed; 2. the file's tier pattern replaced by one
       RE2 refuses (lookbehind); 3. restarted, the coordinator resumes and says the pattern
       was dropped; the worker reports 0 in flight and the drain runs its kill: every
       process of the tree ends (per /proc), none ``survived``."""
    state = tmp_path / "state" / "drain.json"
    first = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "120",
                              "--state-file", str(state), name="first")
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=1)
    worker = register(first, tree["pid"], tiers=[{"name": "shells", "pattern": "^sh "}])["id"]
    with first.client() as client:
        assert client.post(f"/workers/{worker}/report", json={"inflight": 1}).status_code == 200
        assert client.post("/drain", json={"wait": False}).status_code == 202
    wait_for(lambda: json.loads(state.read_text())["phase"] == "migrating" or None,
             what="the drain migrating, on disk")
    sigkill(first)
    document = json.loads(state.read_text())
    [record] = document["workers"]
    record["tiers"][0]["pattern"] = "(?<=x)sh"
    state.write_text(json.dumps(document))

    second = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "120",
                               "--state-file", str(state), name="second")
    loaded = second.status()["state_file"]["loaded"]
    assert loaded["result"] == "restored"
    assert any("shells" in note and "dropped its pattern" in note for note in loaded["notes"])
    with second.client() as client:
        assert client.post(f"/workers/{worker}/report", json={"inflight": 0}).status_code == 200
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    fates = {p["pid"]: p["fate"] for p in summary["processes"]}
    assert "survived" not in fates.values()
    wait_for(lambda: not any(alive(pid) for pid in tree["all"]) or None,
             what="every process of the tree ended")
