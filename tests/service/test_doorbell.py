"""The coordinator's doorbell: the named pipe it rings at a drain's start."""

from __future__ import annotations

import json
import os
import select
import signal
import stat
from pathlib import Path
from typing import Any

from coordinator.service.doorbell import AUTO_PREFIX, Doorbell, sweep_stale
from tests.service.servers import FAST, Running, hold_drains, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


def _hello(running: Running, worker_id: str) -> dict[str, Any]:
    with running.client() as client, client.stream("GET", f"/workers/{worker_id}/events") as r:
        for line in r.iter_lines():
            event: dict[str, Any] = json.loads(line)
            return event
    raise AssertionError("no hello")


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_the_hello_names_the_pipe_rung_at_a_drain_and_taken_back_at_its_abort(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with ``--doorbell PATH`` (in a folder it has to create) and a
       registered worker with 1 in flight: its hello names the pipe by path, device and
       inode; the pipe is mode 0644 and empty.
    2. POST /drain: the pipe is readable (one byte, read by nobody).
    3. DELETE /drain: the byte is taken back, the pipe is empty again.
    4. The coordinator exits on SIGTERM: the pipe is gone and a listener sees end-of-file."""
    bell = tmp_path / "run" / "doorbell"
    running = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(bell))
    holder = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    worker_id = hold_drains(running, holder.pid)
    named = _hello(running, worker_id)["doorbell"]
    st = os.stat(bell)
    assert named == {"path": str(bell), "dev": st.st_dev, "ino": st.st_ino}
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o644
    listener = os.open(bell, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert not _readable(listener)
        with running.client() as client:
            assert client.post("/drain", json={"wait": False}).status_code == 202
            assert _readable(listener)
            assert client.delete("/drain").status_code == 200
            assert not _readable(listener)
        running.proc.send_signal(signal.SIGTERM)
        assert running.proc.wait(timeout=30) == 0
        assert not bell.exists()
        assert _readable(listener)
        assert os.read(listener, 1) == b""
    finally:
        os.close(listener)


def test_doorbell_off_and_an_unusable_path_leave_the_workers_on_their_streams(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``--doorbell off``: the hello names no pipe.
    2. ``--doorbell`` at a regular file: the coordinator serves anyway, says why in its log,
       names no pipe, and leaves the file as it was."""
    off = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", "off", name="off")
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    worker = register(off, sleeper.pid)
    assert "doorbell" not in _hello(off, worker["id"])

    taken = tmp_path / "taken"
    taken.write_text("keep me\n")
    blocked = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(taken),
                                "--log-level", "info", name="blocked")
    worker = register(blocked, sleeper.pid)
    assert "doorbell" not in _hello(blocked, worker["id"])
    assert taken.read_text() == "keep me\n"
    wait_for(lambda: "not a named pipe" in blocked.log.read_text(), what="the reason logged")


def test_a_restarted_coordinator_replaces_the_pipe_a_killed_one_left(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with ``--doorbell PATH``; a listener opens the pipe.
    2. SIGKILL it: the pipe stays on disk (nobody removed it); the listener sees end-of-file.
    3. Start another at the same path: a new pipe (another inode) replaces the old one."""
    bell = tmp_path / "doorbell"
    first = start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(bell), name="first")
    old = os.stat(bell).st_ino
    listener = os.open(bell, os.O_RDONLY | os.O_NONBLOCK)  # also keeps the old inode's number
    try:
        first.proc.kill()
        first.proc.wait(timeout=30)
        assert bell.exists()
        assert _readable(listener)
        assert os.read(listener, 1) == b""
        start_coordinator(janitor, tmp_path, *FAST, "--doorbell", str(bell), name="second")
        assert stat.S_ISFIFO(os.stat(bell).st_mode)
        assert os.stat(bell).st_ino != old
    finally:
        os.close(listener)


def test_the_pipe_is_0644_whatever_the_umask(tmp_path: Path) -> None:
    """1. Open a doorbell under umask 077: listeners of other users may still open it."""
    previous = os.umask(0o077)
    try:
        bell = Doorbell(tmp_path / "doorbell")
        bell.open()
    finally:
        os.umask(previous)
    try:
        assert stat.S_IMODE(os.stat(bell.path).st_mode) == 0o644
    finally:
        bell.close()


def test_sweep_removes_only_the_pipes_of_dead_coordinators(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. In the auto folder: a pipe named after a process that has exited, one named after
       a live process, a regular file named after the dead one, an unrelated pipe.
    2. The sweep removes the dead process's pipe only."""
    gone = janitor.spawn(["true"])
    gone.wait(timeout=30)
    dead_pipe = tmp_path / f"{AUTO_PREFIX}{gone.pid}"
    live_pipe = tmp_path / f"{AUTO_PREFIX}{os.getpid()}"
    dead_file = tmp_path / f"{AUTO_PREFIX}{gone.pid}.txt"
    other = tmp_path / "other-pipe"
    for path in (dead_pipe, live_pipe, other):
        os.mkfifo(path)
    dead_file.write_text("x")
    assert sweep_stale(tmp_path) == 1
    assert not dead_pipe.exists()
    assert live_pipe.exists()
    assert dead_file.exists()
    assert other.exists()


def test_a_link_put_in_the_pipes_place_is_never_followed(tmp_path: Path,
                                                        monkeypatch: Any) -> None:
    """1. the moment the pipe is made, a symlink to a victim file takes its place (what a
       user who can write the directory could do); 2. opening the doorbell fails (the
       coordinator then runs without one); 3. the victim's mode and bytes are untouched."""
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    path = tmp_path / "doorbell"
    made = os.mkfifo

    def swapped(target: Any, mode: int = 0o666) -> None:
        made(target, mode)
        os.unlink(target)
        os.symlink(victim, target)

    monkeypatch.setattr(os, "mkfifo", swapped)
    bell = Doorbell(path)
    try:
        bell.open()
    except OSError:
        pass
    else:
        raise AssertionError("the doorbell opened through a link")
    finally:
        bell.close()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "secret"
