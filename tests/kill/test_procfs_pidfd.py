"""Process facts from /proc and the pidfd layer, against real processes."""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coordinator.kill import pidfd, procfs
from tests.kill.helpers import start_tree
from tests.support.processes import ProcessJanitor, wait_for

SLEEPER = ["-c", "import time; time.sleep(120)"]


def test_start_time_equals_psutil_create_time(janitor: ProcessJanitor) -> None:
    proc = janitor.spawn_python(SLEEPER, service=True, exit_code=-signal.SIGTERM)
    assert procfs.start_time(proc.pid) == psutil.Process(proc.pid).create_time()
    assert procfs.start_time(os.getpid()) == psutil.Process().create_time()


def test_parse_stat_handles_parentheses_and_spaces_in_the_name() -> None:
    fields = ["S", "7", "8", "9"] + ["0"] * 15 + ["4242"] + ["0"] * 29 + ["256"]
    stat = procfs.parse_stat("123 (a) b (c)) " + " ".join(fields))
    assert (stat.pid, stat.name, stat.state, stat.ppid, stat.pgid, stat.sid) == (
        123, "a) b (c)", "S", 7, 8, 9
    )
    assert stat.start_ticks == 4242
    assert stat.exit_status is None  # only a zombie's exit status is meaningful
    zombie = procfs.parse_stat("123 (z) " + " ".join(["Z", *fields[1:]]))
    assert zombie.zombie
    assert zombie.exit_status == 256


def test_descendants_and_ancestors(janitor: ProcessJanitor, tmp_path: Path) -> None:
    tree = start_tree(janitor, {"children": [{"children": [{}]}, {}]}, tmp_path)
    found = procfs.descendants(tree.pid, procfs.snapshot())
    assert sorted(found) == sorted((p["pid"], p["depth"]) for p in tree.processes[1:])
    assert procfs.ancestors()[0] == os.getppid()
    deepest = next(p["pid"] for p in tree.processes if p["depth"] == 2)
    assert procfs.ancestors(deepest)[:2] == [tree.pids()[1], tree.pid]
    assert procfs.read_stat(2**22 + 12345) is None
    tree.end()


def test_pidfd_info_layout_round_trips() -> None:
    """The offsets of struct pidfd_info, checked against a buffer built field by field."""
    buf = bytearray(pidfd.PIDFD_INFO_SIZE)
    struct.pack_into("=QQIII", buf, 0, pidfd.PIDFD_INFO_EXIT | pidfd.PIDFD_INFO_PID, 77, 10,
                     11, 12)
    struct.pack_into("=i", buf, 60, 3 << 8)
    info = pidfd.parse_info(buf)
    assert (info.mask, info.cgroupid, info.pid, info.tgid, info.ppid) == (9, 77, 10, 11, 12)
    assert info.exit_status == 768
    assert info.exit_code == 3
    assert info.supported_mask is None
    assert pidfd.PIDFD_GET_INFO == 0xC050FF0B  # _IOWR(0xFF, 11, 80 bytes)
    request = pidfd.pack_info_request(pidfd.PIDFD_INFO_EXIT)
    assert len(request) == 80
    assert struct.unpack_from("=Q", request)[0] == pidfd.PIDFD_INFO_EXIT


def test_pidfd_info_of_a_live_process_names_it() -> None:
    if not pidfd.support().pidfd:
        pytest.skip("no pidfds on this kernel")
    fd = os.pidfd_open(os.getpid())
    try:
        info = pidfd.get_info(fd, pidfd.PIDFD_INFO_PID)
    finally:
        os.close(fd)
    assert info.pid == os.getpid()
    assert info.ppid == os.getppid()
    assert info.exit_status is None


def test_own_child_exit_code_via_waitid_leaves_it_for_its_parent(
    janitor: ProcessJanitor,
) -> None:
    """1. start a child that exits 7 on SIGTERM; 2. signal it, wait on its pidfd;
    3. waitid(WNOWAIT) gives 7; 4. Popen still reaps it and sees 7 too."""
    code = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
    proc = janitor.spawn_python(["-c", code + "while True: time.sleep(60)"])
    fd = os.pidfd_open(proc.pid)
    try:
        assert pidfd.child_exit_code(fd) is None
        wait_for(lambda: _catches_term(proc.pid), what="the SIGTERM handler")
        pidfd.send_signal(fd, signal.SIGTERM)
        select.select([fd], [], [], 30)
        assert pidfd.has_exited(fd)
        assert pidfd.child_exit_code(fd) == 7
        assert pidfd.exit_code(fd, proc.pid, 0) == 7
        assert proc.wait(timeout=30) == 7
    finally:
        os.close(fd)


def test_killed_child_has_a_negative_exit_code(janitor: ProcessJanitor) -> None:
    proc = janitor.spawn_python(SLEEPER)
    fd = os.pidfd_open(proc.pid)
    try:
        assert pidfd.send_signal(fd, signal.SIGKILL)
        select.select([fd], [], [], 30)
        assert pidfd.child_exit_code(fd) == -signal.SIGKILL
        proc.wait(timeout=30)
        # Reaped: waitid knows nothing more, the kernel still does.
        assert pidfd.child_exit_code(fd) is None
        if pidfd.support().exit_info:
            assert pidfd.reaped_exit_code(fd) == -signal.SIGKILL
        assert not pidfd.send_signal(fd, signal.SIGTERM)  # gone: not an error
    finally:
        os.close(fd)


def test_non_child_exit_code_via_pidfd_get_info(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a tree whose child exits 3 on SIGTERM; 2. open its pidfd (not our child);
    3. SIGTERM it; its parent (the root) reaps it; 4. PIDFD_GET_INFO gives 3."""
    if not pidfd.support().exit_info:
        pytest.skip("PIDFD_INFO_EXIT needs Linux 6.15+")
    tree = start_tree(janitor, {"children": [{"role": "c", "exit_code": 3}]}, tmp_path)
    (child,) = tree.pids("c")
    fd = os.pidfd_open(child)
    try:
        assert pidfd.child_exit_code(fd) is None  # not ours
        pidfd.send_signal(fd, signal.SIGTERM)
        select.select([fd], [], [], 30)
        wait_for(lambda: procfs.read_stat(child) is None, what="the root to reap its child")
        assert pidfd.reaped_exit_code(fd) == 3
        assert pidfd.exit_code(fd, child, 0) == 3
    finally:
        os.close(fd)
    tree.end()


def test_zombie_exit_code_from_proc_stat(janitor: ProcessJanitor) -> None:
    """A zombie not yet reaped: the status is read from /proc/<pid>/stat (start time checked)."""
    code = "import os, sys, time\nif os.fork() == 0: os._exit(5)\nsys.stdin.read(); time.sleep(60)"
    parent = janitor.spawn_python(["-c", code], service=True, exit_code=-signal.SIGTERM)
    kid = wait_for(lambda: psutil.Process(parent.pid).children(), what="the fork")[0].pid
    wait_for(lambda: (s := procfs.read_stat(kid)) is not None and s.zombie, what="a zombie")
    stat = procfs.read_stat(kid)
    assert stat is not None
    fd = os.pidfd_open(kid)
    try:
        assert pidfd.has_exited(fd)
        assert pidfd.exit_code(fd, kid, stat.start_ticks) == 5
        assert pidfd.exit_code(fd, kid, stat.start_ticks + 1) is None  # not the same process
    finally:
        os.close(fd)


READER = """
import json, os, sys
from coordinator.kill import pidfd, procfs
pid, uid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
stat = procfs.read_stat(pid)
fd = os.pidfd_open(pid)
print(json.dumps([stat.exit_status, pidfd.exit_code(fd, pid, stat.start_ticks)]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the zombie and its readers run as "
                    "users of their own")
def test_a_zombie_status_the_kernel_hides_is_unknown_not_0(janitor: ProcessJanitor) -> None:
    """1. A process of user 1001 forks a child that dies of SIGTERM's default action and
       stays a zombie (its parent does not reap it).
    2. A reader of user 1000 may not inspect it, and the kernel writes 0 for the status in
       the zombie's stat: ``read_stat`` and ``pidfd.exit_code`` say unknown (None), not 0.
    3. A reader of the zombie's own user sees the SIGTERM death."""
    # Dumpable again after its setuid (PR_SET_DUMPABLE), as a process started as that user
    # is: the kernel lets the same user inspect only a dumpable process.
    code = ("import ctypes, os, signal, sys, time\n"
            "os.setgroups([]); os.setgid(1001); os.setuid(1001)\n"
            "ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"
            "if os.fork() == 0: os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)\n"
            "sys.stdin.read(); time.sleep(60)")
    parent = janitor.spawn_python(["-c", code], service=True, exit_code=-signal.SIGTERM)
    kid = wait_for(lambda: psutil.Process(parent.pid).children(), what="the fork")[0].pid
    wait_for(lambda: (s := procfs.read_stat(kid)) is not None and s.zombie, what="a zombie")
    seen = {}
    for uid in (1000, 1001):
        reader = janitor.spawn_python(["-c", READER, str(kid), str(uid)],
                                      stdout=subprocess.PIPE, text=True,
                                      env={"PYTHONPATH": str(Path(__file__).parents[2])})
        out, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0, out
        seen[uid] = json.loads(out)
    assert seen[1000] == [None, None]
    assert seen[1001] == [signal.SIGTERM, -signal.SIGTERM]


def test_support_is_detected_once() -> None:
    first = pidfd.support()
    assert pidfd.support() is first
    if sys.platform == "linux" and hasattr(os, "pidfd_open"):
        assert first.pidfd


def _status(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text()


def _catches_term(pid: int) -> bool:
    line = next(x for x in _status(pid).splitlines() if x.startswith("SigCgt:"))
    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_chain_walks_a_parent_map_up_to_pid_1_and_stops_on_a_loop() -> None:
    assert procfs.chain(40, {40: 30, 30: 20, 20: 1, 1: 0}) == [30, 20, 1]
    assert procfs.chain(40, {}) == []
    assert procfs.chain(40, {40: 30, 30: 40}) == [30]  # a torn snapshot cannot loop forever


def test_chain_agrees_with_reading_proc() -> None:
    parent = {pid: stat.ppid for pid, stat in procfs.snapshot().items()}
    assert procfs.chain(os.getpid(), parent) == procfs.ancestors()
