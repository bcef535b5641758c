"""One process the kill cannot act on never cancels the kill of the others.

Each scenario runs real trees next to a process the kill must fail on (a thread id, file
descriptor numbers past 1024, no file descriptors left) and checks, from the trees' own
cleanup records and ``/proc``, that every other process was still ended in order.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator.errors import RefusedTarget
from coordinator.kill import Fate, KillPolicy, Target, procfs, safety, terminate
from tests.kill.helpers import alive, start_time, start_tree
from tests.support.fd_limits import no_fd_left, soft_fd_limit
from tests.support.processes import ProcessJanitor, wait_for

TREE = {"children": [{"role": "scheduler", "children": [{"role": "tp-worker"}]},
                     {"role": "detokenizer"}]}


@contextlib.contextmanager
def fds_numbered_past(number: int) -> Iterator[int]:
    """Hold open file descriptors until the next one opened gets a number above ``number``.

    Raises the soft ``RLIMIT_NOFILE`` for the test (not for the code under test, which
    must cope with whatever the limit is)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = number + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} is below {wanted}")
    held: list[int] = []
    with soft_fd_limit(wanted):
        try:
            while not held or held[-1] < number:
                held.append(os.open("/dev/null", os.O_RDONLY))
            yield held[-1]
        finally:
            for fd in held:
                os.close(fd)


async def test_pidfds_numbered_past_1024_are_watched(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree of four processes; 2. hold ~1,100 file descriptors open, so every
    pidfd the kill opens is numbered above 1024 (``select`` refuses those); 3. terminate;
    4. every process got SIGTERM, ran its cleanup (its own record) and exited 0."""
    tree = start_tree(janitor, TREE, tmp_path)
    with fds_numbered_past(1100) as highest:
        report = await terminate([Target(tree.pid, start_time(tree.pid))],
                                 KillPolicy(tier_timeout_s=30, deadline_s=60))
    assert highest >= 1100
    outcomes = {o.pid: o for o in report.processes}
    assert sorted(outcomes) == sorted(tree.pids())
    assert report.exit_detection == "pidfd"
    assert all(o.fate is Fate.EXITED and o.exit_code == 0 for o in outcomes.values()), \
        report.to_dict()
    assert sorted(tree.markers()) == sorted(tree.pids())
    assert not any(alive(p) for p in tree.pids())


async def test_a_thread_id_target_is_reported_and_the_other_trees_still_end(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. start a tree, and a process with a second thread; 2. terminate both the tree and
    the thread's id as targets; 3. the thread id is reported ``survived`` with why (a thread
    is not a process) and its process is left alone (still running, never signalled);
    4. the tree ended in full: every process's own record says its cleanup ran."""
    tree = start_tree(janitor, TREE, tmp_path / "tree")
    # Left alone by the kill: the janitor stops it at the end (SIGTERM's default action).
    threaded = janitor.spawn_python(["-c", (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "time.sleep(600)\n")], service=True, exit_code=-signal.SIGTERM)
    task_dir = Path(f"/proc/{threaded.pid}/task")

    def second_thread() -> list[int]:
        return [int(t) for t in os.listdir(task_dir) if int(t) != threaded.pid]

    wait_for(lambda: bool(second_thread()), timeout=30, what="the second thread")
    tids = second_thread()
    report = await terminate(
        [Target(tree.pid, start_time(tree.pid)), Target(tids[0])],
        KillPolicy(tier_timeout_s=30, deadline_s=60))
    outcomes = {o.pid: o for o in report.processes}
    assert sorted(outcomes) == sorted([*tree.pids(), tids[0]])
    thread = outcomes[tids[0]]
    assert thread.fate is Fate.SURVIVED
    assert f"thread of process {threaded.pid}" in thread.detail
    assert threaded.poll() is None
    assert alive(threaded.pid)
    assert sorted(tree.markers()) == sorted(tree.pids())
    assert all(outcomes[p].fate is Fate.EXITED for p in tree.pids())
    assert not report.graceful


@pytest.mark.parametrize("boot_time_read", [True, False], ids=["boot-time-read", "no-boot-time"])
async def test_running_out_of_file_descriptors_is_reported_not_called_gone(
    janitor: ProcessJanitor, tmp_path: Path, boot_time_read: bool
) -> None:
    """1. start a tree; read the boot time beforehand (as ``serve`` does) or not; 2. cap the
    soft file descriptor limit at what is open now, so the kill can open nothing (no pidfd,
    not even ``/proc/<pid>/stat``, nor the ancestry it refuses to signal); 3. terminate;
    4. nothing is reported ``gone`` or ``exited``: every process is ``survived`` with the
    reason, and the report is not graceful; 5. the processes are indeed still running."""
    tree = start_tree(janitor, TREE, tmp_path)
    procfs.boot_time.cache_clear()
    if boot_time_read:
        procfs.boot_time()
    # The kill's own asyncio machinery must still work: it opens no new fd for timers.
    with no_fd_left():
        report = await terminate([Target(tree.pid)], KillPolicy(tier_timeout_s=1,
                                                                deadline_s=3))
    assert report.processes, report.to_dict()
    root = next(o for o in report.processes if o.pid == tree.pid)
    assert root.fate is Fate.SURVIVED, root
    assert "Too many open files" in root.detail or "too many open files" in root.detail
    assert not report.graceful
    assert all(alive(p) for p in tree.pids())
    assert tree.markers() == {}
    tree.end()


def test_ancestors_stay_refused_when_no_file_descriptor_is_left() -> None:
    """1. read the ancestry once; 2. cap the fd limit so ``/proc`` cannot be opened;
    3. the parent and every ancestor read before are still refused as targets."""
    chain = [p.pid for p in psutil.Process().parents()]
    safety.protected_pids()
    refused = []
    with no_fd_left():
        for pid in chain:
            try:
                safety.check_targets([pid])
            except RefusedTarget:
                refused.append(pid)
    assert refused == chain
