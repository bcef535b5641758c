"""The state file: atomic replacement, whole-document validation, unusable files set aside,
coalesced writes whose failures are counted and never raised."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordinator.drain import state_file
from coordinator.drain.budget import anchor, split_budget
from coordinator.drain.phases import Phase, Transition
from coordinator.drain.record import DrainRecord
from coordinator.drain.state_file import (
    STATE_VERSION,
    StateFileError,
    StateWriter,
    load_state,
    parse_state,
    write_atomic,
)
from coordinator.kill.policy import TierSpec
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.service.migrations import MigrationBook
from coordinator.service.registry import Worker
from coordinator.service.restore import build, still_running
from tests.drain.fakes import settle

NOW = 1_700_000_000.0


def valid_document(phase: Phase = Phase.MIGRATING) -> dict[str, Any]:
    """A document as the coordinator writes it, made from the real records."""
    split = split_budget(20, tier_timeout_s=2, confirm_s=1)
    drain = DrainRecord(reason="preStop", split=split, deadlines=anchor(split, NOW))
    drain.outcomes[(41, NOW - 5)] = ProcessOutcome(pid=41, name="sleep", start_time=NOW - 5,
                                                  fate=Fate.KILLED, exit_code=-9)
    worker = Worker(id="w-1", pid=40, start_time=NOW - 6, role="engine", name="python",
                    url="http://127.0.0.1:9/", tiers=(TierSpec(name="children", timeout_s=3),),
                    registered_at=NOW - 6)
    book = MigrationBook()
    book.add("w-1", None, "req-1", 12)
    book.pending["req-1"].handed_back_at = NOW
    book.ack(["req-2"])
    book.early["req-2"] = NOW
    document = {
        "version": STATE_VERSION, "saved_at": NOW, "coordinator_pid": 7,
        "phase": phase.value, "generation": 12,
        "timeline": [Transition(Phase.SERVING, NOW - 10, 1, "started").to_dict(),
                     Transition(Phase.DRAINING, NOW, 2, "preStop").to_dict()],
        "drain": None if phase is Phase.SERVING else drain.to_record(),
        "last": None, "workers": [worker.to_record()], "migrations": book.to_record(),
    }
    parsed: dict[str, Any] = json.loads(encode(document))  # as read back: lists, not tuples
    return parsed


def encode(document: Any) -> bytes:
    return json.dumps(document).encode()


def test_every_phase_of_a_written_document_is_valid_and_builds() -> None:
    for phase in Phase:
        document = valid_document(phase)
        assert parse_state(encode(document), NOW) == document
        state = build(document)
        assert state.phase is phase
        assert [w.pid for w in state.workers] == [40]
        assert state.migrations.counts()["pending"] == 1
        assert (state.drain is None) == (phase is Phase.SERVING)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = document
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return change


_DELETE = object()

BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "unknown version": (_set("version", 999), "unknown version 999"),
    "version as text": (_set("version", "1"), "unknown version '1'"),
    "version true": (_set("version", True), "unknown version True"),
    "no version": (_set("version", _DELETE), "missing key 'version'"),
    "no phase": (_set("phase", _DELETE), "missing key 'phase'"),
    "no timeline": (_set("timeline", _DELETE), "missing key 'timeline'"),
    "no workers": (_set("workers", _DELETE), "missing key 'workers'"),
    "no migrations": (_set("migrations", _DELETE), "missing key 'migrations'"),
    "no drain": (_set("drain", _DELETE), "missing key 'drain'"),
    "unknown phase": (_set("phase", "paused"), "phase: 'paused' is not one of"),
    "phase a number": (_set("phase", 3), "phase: expected a string, found an integer"),
    "generation text": (_set("generation", "12"), "generation: expected an integer"),
    "generation float": (_set("generation", 1.5), "generation: expected an integer"),
    "generation bool": (_set("generation", True), "generation: expected an integer"),
    "timeline object": (_set("timeline", {}), "timeline: expected a list, found an object"),
    "timeline entry": (_set("timeline.1.at", "noon"), "timeline[1].at: expected a number"),
    "drain a list": (_set("drain", []), "drain: expected an object, found a list"),
    "drain no budget": (_set("drain.budget_s", _DELETE), "drain: missing key 'budget_s'"),
    "budget text": (_set("drain.budget_s", "20"), "drain.budget_s: expected a number"),
    "budget negative": (_set("drain.budget_s", -1), "drain.budget_s: -1 is outside"),
    "budget huge": (_set("drain.budget_s", 1e9), "drain.budget_s: 1000000000.0 is outside"),
    "start NaN": (_set("drain.started_at", float("nan")), "drain.started_at: nan is outside"),
    "start inf": (_set("drain.started_at", float("inf")), "drain.started_at: inf is outside"),
    "start bigint": (_set("drain.started_at", 10**400), "drain.started_at:"),
    "start future": (_set("drain.started_at", NOW + 3600), "drain.started_at: 1700003600.0 is "
                                                           "in the future"),
    "force text": (_set("drain.force", "yes"), "drain.force: expected true or false"),
    "outcomes object": (_set("drain.outcomes", {}), "drain.outcomes: expected a list"),
    "fate unknown": (_set("drain.outcomes.0.fate", "zombie"), "drain.outcomes[0].fate:"),
    "pid zero": (_set("drain.outcomes.0.pid", 0), "drain.outcomes[0].pid: 0 is outside"),
    "pid huge": (_set("drain.outcomes.0.pid", 2**40), "drain.outcomes[0].pid:"),
    "exit code text": (_set("drain.outcomes.0.exit_code", "-9"), "exit_code: expected an int"),
    "worker pid text": (_set("workers.0.pid", "40"), "workers[0].pid: expected an integer"),
    "worker no id": (_set("workers.0.id", _DELETE), "workers[0]: missing key 'id'"),
    "tier signal": (_set("workers.0.tiers.0.signal", 99), "workers[0].tiers[0].signal: 99"),
    "migration tokens": (_set("migrations.pending.0.tokens", None), "pending[0].tokens:"),
    "early ack pair": (_set("migrations.early", [["req-2"]]), "early[0]: expected a list of"),
    "last a string": (_set("last", "x"), "last: expected an object, found a string"),
    "migrating without drain": (_set("drain", None), "the phase is migrating but no drain"),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_a_wrong_document_is_refused_naming_where(case: str) -> None:
    change, message = BROKEN[case]
    document = valid_document()
    change(document)
    with pytest.raises(StateFileError) as info:
        parse_state(json.dumps(document).encode(), NOW)
    assert message in str(info.value)


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff\xfe{}", "not UTF-8 (byte 0"),
    (b"{torn", "not JSON"),
    (b"", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"[]", "the document is a list, not an object"),
    (b"null", "the document is null, not an object"),
    (b'"state"', "the document is a string, not an object"),
    (b'{"version":1,"phase":"migrating","drain":{"reason":"x"}}', "missing key"),
])
def test_bytes_that_are_no_document_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(StateFileError, match=re.escape(message)):
        parse_state(data, NOW)


def test_serving_with_a_drain_is_refused() -> None:
    document = valid_document(Phase.SERVING)
    document["drain"] = valid_document()["drain"]
    with pytest.raises(StateFileError, match="a drain is recorded while the phase is serving"):
        parse_state(encode(document), NOW)


def test_unknown_keys_are_ignored() -> None:
    document = valid_document()
    document["from_a_newer_writer"] = {"x": 1}
    document["drain"]["expired_before"] = 0
    assert parse_state(encode(document), NOW) == document


# --- reading files ----------------------------------------------------------------------


def test_write_replaces_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, valid_document(Phase.DRAINING))
    write_atomic(path, valid_document(Phase.MIGRATING))
    assert load_state(path, NOW).document == valid_document(Phase.MIGRATING)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_missing_file_is_a_fresh_start(tmp_path: Path) -> None:
    loaded = load_state(tmp_path / "nothing" / "state.json")
    assert (loaded.document, loaded.problem, loaded.moved_to) == (None, None, None)
    assert list(tmp_path.iterdir()) == []


def _aside(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("state.json.corrupt-*"))


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe", b"{torn", encode({"version": 2})])
def test_an_unusable_file_is_moved_aside_intact(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    loaded = load_state(path, NOW)
    assert loaded.document is None
    assert loaded.problem
    assert not path.exists()
    assert _aside(tmp_path) == [loaded.moved_to]
    assert loaded.moved_to is not None
    assert loaded.moved_to.read_bytes() == content
    assert loaded.moved_to.name.endswith("Z")


def test_a_directory_at_the_path_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    (path / "inside").mkdir(parents=True)
    loaded = load_state(path, NOW)
    assert loaded.problem == "a directory, not a file"
    assert loaded.moved_to is not None
    assert (loaded.moved_to / "inside").is_dir()
    assert not path.exists()


def test_a_named_pipe_at_the_path_does_not_block_and_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    os.mkfifo(path)
    loaded = load_state(path, NOW)
    assert loaded.problem == "not a regular file"
    assert not path.exists()
    assert _aside(tmp_path) == [loaded.moved_to]


def test_a_path_under_a_file_is_unreadable_and_cannot_be_moved(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    loaded = load_state(tmp_path / "file" / "state.json", NOW)
    assert loaded.document is None
    assert loaded.problem is not None
    assert loaded.problem.startswith("unreadable")
    assert loaded.moved_to is None


def test_two_unusable_files_in_a_row_are_both_kept(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for content in (b"first", b"second"):
        path.write_bytes(content)
        assert load_state(path, NOW).moved_to is not None
    assert sorted(p.read_bytes() for p in _aside(tmp_path)) == [b"first", b"second"]


# --- writing ---------------------------------------------------------------------------------


async def test_many_changes_coalesce_into_few_writes(tmp_path: Path) -> None:
    """1. mark dirty 100 times in one loop iteration; 2. flush; 3. the file holds the last
    state and far fewer than 100 writes happened."""
    path = tmp_path / "state.json"
    state: dict[str, Any] = {"n": 0}
    writer = StateWriter(path, lambda: dict(state))
    for n in range(100):
        state["n"] = n
        writer.mark_dirty()
    await writer.flush()
    await writer.close()
    assert json.loads(path.read_text()) == {"version": STATE_VERSION, "n": 99}
    assert writer.writes <= 2
    assert writer.status()["ok"] is True


async def test_no_path_means_no_file(tmp_path: Path) -> None:
    writer = StateWriter(None, dict)
    writer.mark_dirty()
    await writer.flush()
    await writer.close()
    assert writer.writes == 0
    assert writer.status()["path"] is None


async def test_a_failing_write_is_counted_never_raised_and_retried(tmp_path: Path) -> None:
    """1. the state file's directory is a file: flush fails, counted and shown, no raise;
    2. the path becomes writable; 3. the retry writes the latest state on its own."""
    blocker = tmp_path / "dir"
    blocker.write_text("not a directory")
    path = blocker / "state.json"
    results: list[bool] = []
    written = asyncio.Event()

    def on_result(ok: bool) -> None:
        results.append(ok)
        if ok:
            written.set()

    writer = StateWriter(path, lambda: {"phase": "draining"}, on_result=on_result)
    await writer.flush()
    status = writer.status()
    assert (status["ok"], status["writes"], status["failures"]) == (False, 0, 1)
    assert "FileExistsError" in status["last_error"]
    assert results == [False]
    blocker.unlink()
    await asyncio.wait_for(written.wait(), 30)
    await writer.close()
    assert json.loads(path.read_text()) == {"version": STATE_VERSION, "phase": "draining"}
    assert writer.status()["ok"] is True
    assert writer.failures == 1


async def test_while_failing_changes_wait_for_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing disk is not hammered: after a failure, changes only mark the state dirty;
    flush() still tries each time."""
    monkeypatch.setattr(state_file, "RETRY_FIRST_S", 3600.0)
    attempts: list[int] = []

    def failing(_path: Path, _document: dict[str, Any]) -> None:
        attempts.append(1)
        raise OSError(28, "No space left on device")

    writer = StateWriter(tmp_path / "s.json", dict, write=failing)
    await writer.flush()
    for _ in range(10):
        writer.mark_dirty()
    # Every task those changes could have started has ended: none tried to write.
    await settle()
    assert len(attempts) == 1
    await writer.flush()
    assert len(attempts) == 2
    assert writer.status()["last_error"] == "OSError: [Errno 28] No space left on device"
    await writer.close()


async def test_a_snapshot_that_raises_is_a_failed_write(tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("bug")

    writer = StateWriter(tmp_path / "s.json", broken)
    await writer.flush()
    assert writer.status()["last_error"] == "RuntimeError: bug"
    await writer.close()


async def test_a_hung_disk_does_not_hold_a_flush(tmp_path: Path) -> None:
    """1. the write blocks; 2. flush returns once its bound passed, write still pending
    (it cannot have ended: the disk has not answered), and the write is underway (its
    thread may start only after the bound on a loaded machine, so that is waited for);
    3. the disk answers; 4. close() finishes the write."""
    release = threading.Event()
    started = threading.Event()

    def hung(path: Path, document: dict[str, Any]) -> None:
        started.set()
        release.wait(60)
        write_atomic(path, document)

    path = tmp_path / "s.json"
    writer = StateWriter(path, lambda: {"n": 1}, write=hung, flush_timeout_s=0.05)
    await writer.flush()
    assert writer.writes == 0
    assert not release.is_set()
    assert await asyncio.to_thread(started.wait, 60)
    assert writer.writes == 0
    release.set()
    writer.flush_timeout_s = 30
    await writer.close()
    assert writer.writes == 1
    assert json.loads(path.read_text())["n"] == 1



def test_only_what_a_drain_left_behind_can_still_run() -> None:
    """A finished drain holds its cycle only through processes it reported ``survived``
    (or ``running``) that still exist with the same start time; one it saw end does not,
    whatever holds its PID now."""
    me = os.getpid()
    started = psutil.Process(me).create_time()
    split = split_budget(20, tier_timeout_s=2, confirm_s=1)
    drain = DrainRecord(reason="x", split=split, deadlines=anchor(split, NOW))
    for n, (fate, start) in enumerate([(Fate.EXITED, started), (Fate.SURVIVED, started - 60),
                                       (Fate.SURVIVED, started)]):
        drain.outcomes[(me, float(n))] = ProcessOutcome(pid=me, name="me", start_time=start,
                                                        fate=fate)
    assert [(o.fate, o.start_time) for o in still_running(drain)] == [(Fate.SURVIVED, started)]
