"""The scheduling hint for engines that share CPUs: a short slice for the loop thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.service.servers import FAST, hold_drains, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from worker_client import WorkerClient
from worker_client._scheduling import set_thread_slice

CHILD = Path(__file__).with_name("reader_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _slice_ns(pid: int, tid: int) -> int | None:
    """The thread's EEVDF slice, from /proc (None on kernels that do not show it)."""
    for line in Path(f"/proc/{pid}/task/{tid}/sched").read_text().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    return None


def _holds_slice(pid: int, slice_ns: int | None) -> bool:
    """The engine's loop thread (its main thread) has that slice now."""
    return _slice_ns(pid, pid) == slice_ns


needs_slices = pytest.mark.skipif(
    _slice_ns(os.getpid(), os.getpid()) is None,
    reason="this kernel has no per-task scheduling slice (Linux < 6.12)")


@needs_slices
def test_the_slice_is_set_on_the_calling_thread_only() -> None:
    """1. A thread asks for a 200 us slice: /proc shows it for that thread.
    2. The thread that started it keeps its own slice."""
    pid = os.getpid()
    before = _slice_ns(pid, threading.get_native_id())
    seen: list[tuple[bool, int | None]] = []

    def ask() -> None:
        taken = set_thread_slice(200)
        seen.append((taken, _slice_ns(pid, threading.get_native_id())))

    worker = threading.Thread(target=ask)
    worker.start()
    worker.join()
    assert seen == [(True, 200_000)]
    assert _slice_ns(pid, threading.get_native_id()) == before


@needs_slices
def test_an_engine_with_the_hint_runs_its_loop_with_the_short_slice_and_still_drains(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator; an asyncio engine started with WORKER_CLIENT_LATENCY_SLICE_US=100.
    2. Once registered, its loop thread (the main thread) has a 100 us slice.
    3. POST /drain: its shutdown_event is set on its loop (by the doorbell or the line; the
       yield after a doorbell notice returns), the drain ends done and its kill's SIGTERM
       ends the engine."""
    coordinator = start_coordinator(janitor, tmp_path, *FAST)
    child = janitor.spawn(
        [sys.executable, str(CHILD), coordinator.url, "loop"], cwd=ROOT, stdout=subprocess.PIPE,
        env={"PYTHONPATH": str(ROOT), "WORKER_CLIENT_LATENCY_SLICE_US": "100"})
    assert child.stdout is not None
    assert child.stdout.readline() == b"registered\n"
    wait_for(lambda: _slice_ns(child.pid, child.pid) == 100_000, what="the loop's slice")
    wait_for(lambda: any(w["connected"] for w in coordinator.status()["workers"]),
             what="event stream open")
    with coordinator.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
        line = child.stdout.readline().decode()
        assert line.startswith("drain read-in=MainThread set-on-loop=True source="), line
        assert client.get("/drain").json()["phase"] == "done"
    assert child.wait(timeout=30) == -signal.SIGTERM


@needs_slices
@pytest.mark.parametrize("setting", [None, "0"])
def test_by_default_the_short_slice_lasts_from_the_ring_to_the_abort(
    janitor: ProcessJanitor, tmp_path: Path, setting: str | None
) -> None:
    """1. A coordinator with its doorbell; an asyncio engine with the default scheduling
       (or WORKER_CLIENT_LATENCY_SLICE_US=0: left alone); a registered holder keeps each
       drain in migrating until the test aborts it.
    2. While it serves, its loop thread has the kernel's default slice.
    3. POST /drain: the doorbell sets its shutdown_event; its loop thread now has a 100 us
       slice (0: still the default one).
    4. DELETE /drain: serving again, the default slice again.
    5. The next drain ends done; its kill's SIGTERM ends the engine."""
    bell = tmp_path / "run" / "doorbell"
    coordinator = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(bell))
    env = {"PYTHONPATH": str(ROOT)}
    if setting is not None:
        env["WORKER_CLIENT_LATENCY_SLICE_US"] = setting
    child = janitor.spawn([sys.executable, str(CHILD), coordinator.url, "loop", "follow"],
                          cwd=ROOT, stdout=subprocess.PIPE, env=env)
    held = hold_drains(coordinator, janitor.spawn(["sleep", "600"]).pid)
    assert child.stdout is not None
    assert child.stdout.readline() == b"registered\n"
    default = _slice_ns(child.pid, child.pid)
    assert default != 100_000
    during = 100_000 if setting is None else default
    with coordinator.client() as client:
        wait_for(lambda: any(w["connected"] for w in coordinator.status()["workers"]),
                 what="event stream open")
        assert client.post("/drain", json={"wait": False}).status_code == 202
        line = child.stdout.readline().decode()
        assert line.startswith("drain read-in=MainThread set-on-loop=True source="), line
        # The doorbell rings before the drain line is written; the slice is taken when it
        # is heard, whichever of the two the engine read first.
        wait_for(lambda: _holds_slice(child.pid, during), what="the loop's slice in the drain")
        assert child.stdout.readline() == b"deadline-known\n"
        assert client.delete("/drain").status_code == 200
        assert child.stdout.readline() == b"aborted\n"
        assert _holds_slice(child.pid, default)
        client.post(f"/workers/{held}/report", json={"inflight": 0})
        assert client.get("/drain").json()["phase"] == "done"
    assert child.wait(timeout=30) == -signal.SIGTERM


@pytest.mark.parametrize("slice_us", [-1, 99, 100_001])
def test_a_slice_out_of_the_kernels_range_is_refused(slice_us: int) -> None:
    """1. Below the kernel's 100 us floor (0 is ``off``), or above its 100 ms ceiling:
       ValueError at construction, before anything runs."""
    with pytest.raises(ValueError, match="latency_slice_us"):
        WorkerClient(None, latency_slice_us=slice_us)
