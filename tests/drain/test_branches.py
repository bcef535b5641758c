"""Drain and state-file paths the scenario tests do not take: a change wait with no time, an
escalation of the kill that fails, state files too large or with every aside name taken, a
write cancelled on its way to the disk, a result callback that raises, a retry that fails
again, a process gone by the time a finished drain looks for it, and a document that passes
validation but cannot be turned into objects (a real coordinator sets it aside)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

import pytest

from coordinator.drain import changes as changes_module
from coordinator.drain import state_file
from coordinator.drain.budget import anchor, split_budget
from coordinator.drain.changes import ChangeSignal
from coordinator.drain.phases import Phase, Transition
from coordinator.drain.record import DrainRecord
from coordinator.drain.state_file import (
    MAX_STATE_BYTES,
    STATE_VERSION,
    StateWriter,
    load_state,
    parse_state,
    set_aside,
    write_atomic,
)
from coordinator.kill.report import Fate, ProcessOutcome
from coordinator.service.restore import build, is_running, still_running
from tests.drain.fakes import Harness, blocks, exited, reports
from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
NOW = 1_700_000_000.0


async def until_true(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Let the loop run until ``condition()`` holds (for state a thread's result settles)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# --- the change signal ---------------------------------------------------------------------


async def test_a_wait_without_time_returns_at_once_and_waiters_are_counted() -> None:
    """1. a wait of no time is a timeout, and nobody waits; 2. a real wait is counted until
    a change wakes it; 3. an expiry that comes after the change leaves the answer as it was."""
    changes = ChangeSignal()
    assert await changes.wait(0) is False
    assert changes.waiting == 0
    waiter = asyncio.ensure_future(changes.wait(30))
    await asyncio.sleep(0)
    assert changes.waiting == 1
    changes.notify()
    assert await waiter is True
    assert changes.waiting == 0
    woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    woken.set_result(True)
    changes_module._expire(woken)  # the timer firing late, after notify() resolved it
    assert woken.result() is True


# --- the controller ------------------------------------------------------------------------


async def test_a_failing_escalation_of_the_running_kill_is_recorded() -> None:
    """1. the graceful kill runs (blocked); a force request joins and escalates it, and the
       escalation raises;
    2. the failure is in the drain's errors, the drain still ends when the kill returns,
       and its outcome says the drain failed internally."""
    h = Harness.build()
    release = asyncio.Event()
    h.kill.script(blocks(release, reports(exited(100))))

    def broken(_call: object) -> None:
        raise RuntimeError("escalation broke")

    h.kill.on_escalate = broken
    try:
        drain, _ = h.controller.start("preStop")
        await h.until(lambda: len(h.kill.calls) == 1, "the kill started")
        h.controller.start("operator", force=True)
        assert h.kill.escalations == 1
        release.set()
        await h.finish()
    finally:
        release.set()
        await h.controller.close()
    assert "escalating the kill failed (RuntimeError: escalation broke)" in drain.errors
    assert drain.force
    assert drain.outcome == "error"


# --- the state file ------------------------------------------------------------------------


def test_a_state_file_larger_than_the_limit_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with path.open("wb") as handle:
        handle.truncate(MAX_STATE_BYTES + 1)
    loaded = load_state(path)
    assert (loaded.document, loaded.problem) == (None, f"larger than {MAX_STATE_BYTES} bytes")
    assert loaded.moved_to is not None
    assert loaded.moved_to.exists()
    assert not path.exists()


def test_a_write_that_cannot_replace_the_file_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The path is taken by a directory that is not empty: the write fails, and neither the
    directory nor a temporary file is left changed or behind."""
    path = tmp_path / "state.json"
    path.mkdir()
    (path / "keep").write_text("x")
    with pytest.raises(IsADirectoryError):
        write_atomic(path, {"version": STATE_VERSION})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert sorted(p.name for p in path.iterdir()) == ["keep"]


def test_files_set_aside_in_the_same_instant_get_numbered_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. the clock stands still: a file is set aside where an earlier one already lies: it
       gets ``-2``; 2. with every numbered name up to ``-99`` taken, the last is used."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Frozen:
            return cls(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

    monkeypatch.setattr(state_file, "datetime", Frozen)
    aside = tmp_path / "state.json.corrupt-20240102T030405.678901Z"
    path = tmp_path / "state.json"
    aside.write_text("earlier")
    path.write_text("second")
    assert set_aside(path, "test") == Path(f"{aside}-2")
    assert Path(f"{aside}-2").read_text() == "second"
    for n in range(3, 100):
        Path(f"{aside}-{n}").write_text("earlier")
    path.write_text("third")
    assert set_aside(path, "test") == Path(f"{aside}-99")
    assert Path(f"{aside}-99").read_text() == "third"
    assert aside.read_text() == "earlier"
    assert not path.exists()


async def test_a_write_cancelled_on_its_way_leaves_the_state_to_write(tmp_path: Path) -> None:
    """1. a write is in progress (held in its thread); the task that runs it is cancelled
       (the loop is going away); 2. the state is still marked as changed, so closing the
       writer writes it."""
    started, go_on = threading.Event(), threading.Event()

    def held(path: Path, document: dict[str, Any]) -> None:
        started.set()
        go_on.wait(30)
        write_atomic(path, document)

    path = tmp_path / "state.json"
    writer = StateWriter(path, lambda: {"phase": "serving"}, write=held)
    writer.mark_dirty()
    assert await asyncio.to_thread(started.wait, 30)
    task = writer._task
    assert task is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer._dirty
    go_on.set()
    await writer.close()
    assert writer.writes == 1
    assert json.loads(path.read_text()) == {"version": STATE_VERSION, "phase": "serving"}


async def test_a_result_callback_that_raises_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(ok: bool) -> None:
        raise RuntimeError("metrics broke")

    writer = StateWriter(tmp_path / "state.json", lambda: {"phase": "serving"},
                         on_result=broken)
    await writer.flush()
    await writer.close()
    assert (writer.writes, writer.failing) == (1, False)
    assert "reporting a write result failed" in caplog.text


async def test_a_retry_that_fails_again_waits_for_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. every write fails (disk full); 2. the retry fails as well: counted, and the writer
    keeps failing (no write reached the disk) until it is closed."""
    monkeypatch.setattr(state_file, "RETRY_FIRST_S", 0.01)
    path = tmp_path / "state.json"
    attempts: list[float] = []
    retried = threading.Event()

    def full(target: Path, document: dict[str, Any]) -> None:
        attempts.append(time.monotonic())
        if len(attempts) >= 2:
            retried.set()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    writer = StateWriter(path, lambda: {"phase": "serving"}, write=full)
    writer.mark_dirty()
    assert await asyncio.to_thread(retried.wait, 30)
    await until_true(lambda: writer.failures >= 2, "the retry counted as failed")
    await writer.close()
    assert writer.failing
    assert writer.writes == 0
    full_disk = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"
    assert writer.last_error == f"OSError: {full_disk}: {path}"
    assert not path.exists()


# --- restore and the coordinator's start-up ---------------------------------------------------


def test_a_process_gone_is_not_left_running_by_a_finished_drain() -> None:
    split = split_budget(20, tier_timeout_s=2, confirm_s=1)
    drain = DrainRecord(reason="preStop", split=split, deadlines=anchor(split, NOW))
    gone = ProcessOutcome(pid=PID_MAX + 1, name="engine", start_time=NOW, fate=Fate.SURVIVED)
    drain.outcomes[(gone.pid, gone.start_time)] = gone
    assert not is_running(gone.pid, gone.start_time)
    assert still_running(drain) == []


def unbuildable_document() -> dict[str, Any]:
    """A document ``validate`` accepts whose worker ``build`` refuses (a state it does not
    know)."""
    return {
        "version": STATE_VERSION, "saved_at": NOW, "coordinator_pid": 7,
        "phase": Phase.SERVING.value, "generation": 3,
        "timeline": [Transition(Phase.SERVING, NOW - 10, 1, "started").to_dict()],
        "drain": None, "last": None,
        "workers": [{"id": "w-1", "pid": 40, "start_time": NOW - 6, "role": "engine",
                     "state": "hibernating"}],
        "migrations": {},
    }


def test_a_state_file_that_validates_but_cannot_be_restored_is_set_aside(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a state file that passes validation but whose worker cannot be made;
    2. a coordinator started with it sets it aside as unusable and serves; 3. it stops on
    SIGTERM with exit 0."""
    document = unbuildable_document()
    data = json.dumps(document).encode()
    assert parse_state(data, NOW) == document
    with pytest.raises(ValueError, match="hibernating"):
        build(document)
    path = tmp_path / "state.json"
    path.write_bytes(data)
    running = start_coordinator(janitor, tmp_path, "--state-file", str(path))
    status = running.status()
    loaded = status["state_file"]["loaded"]
    assert loaded["result"] == "set_aside"
    assert loaded["problem"].startswith("cannot be restored (ValueError: ")
    moved = Path(loaded["moved_to"])
    assert moved.read_bytes() == data
    assert status["phase"] == "serving"
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(timeout=30) == 0
