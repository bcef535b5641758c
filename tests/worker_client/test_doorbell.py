"""The doorbell: one write by the coordinator wakes every worker watching the named pipe."""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from coordinator.service.doorbell import Doorbell
from tests.service.servers import FAST, hold_drains, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from worker_client._doorbell import DoorbellWatch, _open_verified

CHILD = Path(__file__).with_name("reader_child.py")
RELAY = Path(__file__).parents[1] / "support" / "tcp_relay.py"
ROOT = Path(__file__).resolve().parents[2]


def test_the_doorbell_wakes_an_engine_whose_stream_is_stalled(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with its doorbell in the test's folder; an engine (loop reader) that
       reaches it through a TCP relay process; a registered holder reporting 1 in flight
       keeps each drain in migrating until the test aborts it.
    2. Once the engine watches the pipe, stop the relay (SIGSTOP): the drain line can no
       longer reach the engine, nothing is closed.
    3. POST /drain: the engine's shutdown_event is set anyway, on its loop, by the doorbell.
    4. Let the relay go on (SIGCONT): the drain line arrives and brings the deadline.
    5. DELETE /drain: the engine serves again; stall the relay and drain again: the doorbell
       (taken back at the abort, the engine watching it again) wakes the engine again.
    6. The second drain ends done; its kill's SIGTERM ends the engine."""
    bell = tmp_path / "run" / "doorbell"
    coordinator = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(bell))
    relay = janitor.spawn_python([str(RELAY), coordinator.url.rsplit(":", 1)[1]],
                                 stdout=subprocess.PIPE, service=True,
                                 exit_code=-signal.SIGTERM)
    assert relay.stdout is not None
    relayed = f"http://127.0.0.1:{int(relay.stdout.readline())}"
    child = janitor.spawn([sys.executable, str(CHILD), relayed, "loop", "follow"], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
    held = hold_drains(coordinator, janitor.spawn(["sleep", "600"]).pid)
    assert child.stdout is not None
    assert child.stdout.readline() == b"registered\n"
    with coordinator.client() as client:
        for round_ in range(2):
            # The engine opens the pipe when it reads the hello that names it, and watches
            # it again when it reads the abort.
            wait_for(lambda: _holds(child.pid, bell), what="the engine holding the doorbell")
            os.kill(relay.pid, signal.SIGSTOP)
            try:
                assert client.post("/drain", json={"wait": False}).status_code == 202
                line = child.stdout.readline().decode()
                assert line == "drain read-in=MainThread set-on-loop=True source=doorbell\n"
            finally:
                os.kill(relay.pid, signal.SIGCONT)
            assert child.stdout.readline() == b"deadline-known\n"
            if round_ == 0:
                assert client.delete("/drain").status_code == 200
                assert child.stdout.readline() == b"aborted\n"
        client.post(f"/workers/{held}/report", json={"inflight": 0})
        assert client.get("/drain").json()["phase"] == "done"
    assert child.wait(timeout=30) == -signal.SIGTERM


def _holds(pid: int, fifo: Path) -> bool:
    """Process ``pid`` has ``fifo`` open."""
    target = os.stat(fifo)
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            st = os.stat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _pending(fd: int) -> int:
    """Bytes waiting in the pipe, without reading them."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


async def _until(condition: asyncio.Event) -> None:
    await asyncio.wait_for(condition.wait(), 30)


def test_a_watch_fires_once_per_ring_and_again_after_a_reset(tmp_path: Path) -> None:
    """1. A coordinator's doorbell and a watch on an asyncio loop, in this process.
    2. Ring: the watch calls back once and stops watching (nobody reads the byte: it stays
       for the other workers).
    3. Ring again without a reset (the same drain): still the one byte in the pipe.
    4. Reset (the drain was aborted): the pipe is empty; the watch is re-armed.
    5. Ring (a new drain): the watch calls back again."""
    bell = Doorbell(tmp_path / "doorbell")
    info = bell.open()

    async def scenario() -> int:
        rung = asyncio.Event()
        calls = 0

        def on_ring() -> None:
            nonlocal calls
            calls += 1
            rung.set()

        watch = DoorbellWatch(asyncio.get_running_loop(), on_ring)

        def watching() -> bool:  # a call: mypy would narrow the property across awaits
            return watch.watching

        watch.arm(info.as_json())
        assert watching()
        bell.ring()
        await _until(rung)
        assert not watching()
        bell.ring()  # same drain: no second byte
        fd = os.open(bell.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert _pending(fd) == 1
            bell.reset()
            assert not _readable(fd)
            watch.rearm()
            assert watching()
            rung.clear()
            bell.ring()
            await _until(rung)
        finally:
            os.close(fd)
            watch.close()
        return calls

    try:
        assert asyncio.run(scenario()) == 2
    finally:
        bell.close()


def test_a_watch_lets_go_of_a_doorbell_whose_coordinator_is_gone(tmp_path: Path) -> None:
    """1. A watch on a coordinator's doorbell.
    2. The coordinator closes its end (it exits, or is SIGKILLed: the kernel closes it).
    3. The watch sees end-of-file, not a ring: no callback, the pipe is closed, and the
       next hello can name the new coordinator's pipe."""
    bell = Doorbell(tmp_path / "doorbell")
    info = bell.open()

    async def scenario() -> tuple[bool, bool]:
        rang = False

        def on_ring() -> None:
            nonlocal rang
            rang = True

        watch = DoorbellWatch(asyncio.get_running_loop(), on_ring)
        watch.arm(info.as_json())
        bell.close()
        while watch.watching:  # noqa: ASYNC110 (the watch has no close event)
            await asyncio.sleep(0.005)
        return rang, watch._fd is None

    assert asyncio.run(scenario()) == (False, True)
    assert not bell.path.exists()


def test_a_worker_uses_only_the_pipe_the_coordinator_named(tmp_path: Path) -> None:
    """1. The coordinator's doorbell, then at its path: the same pipe (used), the same path
       with another inode (another mount namespace's file: refused), a regular file
       (refused without being opened as a pipe), nothing (refused)."""
    bell = Doorbell(tmp_path / "doorbell")
    info = bell.open()
    try:
        fd = _open_verified(info.path, info.dev, info.ino)
        assert fd is not None
        os.close(fd)
        assert _open_verified(info.path, info.dev, info.ino + 1) is None
    finally:
        bell.close()
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert _open_verified(str(plain), info.dev, plain.stat().st_ino) is None
    assert _open_verified(str(tmp_path / "missing"), info.dev, info.ino) is None


@pytest.mark.parametrize("info", [None, {}, {"path": "/x", "dev": "1", "ino": 2}])
def test_a_hello_without_a_usable_doorbell_leaves_the_stream_alone(
    info: dict[str, object] | None,
) -> None:
    """1. A hello with no doorbell, or a malformed one: the watch holds nothing."""

    async def scenario() -> bool:
        watch = DoorbellWatch(asyncio.get_running_loop(), lambda: None)
        watch.arm(info)
        return watch.watching

    assert asyncio.run(scenario()) is False
