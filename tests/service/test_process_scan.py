"""The process scan never loses what a crashed root had under it, whichever comes first: the
scan that sees the root dead, or the registry noticing its worker exited."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil

from coordinator.kill.adoption import AdoptionRules
from coordinator.service.process_scan import ProcessScan
from tests.kill.helpers import alive, start_time, start_tree
from tests.support.processes import ProcessJanitor, wait_for

PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def reaping_orphans() -> Iterator[None]:
    """This process as the reaper of the orphans of its children's trees (as a container's
    init is), for the ``with`` block only."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def orphaned_to_us(pid: int) -> bool:
    return psutil.Process(pid).ppid() == os.getpid()


def reaped(pid: int) -> bool:
    return os.waitpid(pid, os.WNOHANG)[0] == pid


TREE = {"children": [{"role": "scheduler", "children": [{"role": "tp-worker"}]},
                     {"role": "detokenizer"}]}


async def test_a_scan_that_sees_the_root_dead_first_keeps_what_it_had(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a registered root with three descendants, listed by a scan; 2. every process of
    the tree is SIGKILLed (a crash: the children die with the root), the root left a zombie
    (its worker's exit not noticed yet); 3. a scan runs, and only then the root's exit is
    recorded; the descendants are reaped before that scan (as a container's init reaps
    orphans), so none is left for another rule to find; 4. what the kill takes for that root
    still holds all three descendants."""
    tree = start_tree(janitor, TREE, tmp_path)
    root = tree.pid
    started = start_time(root)
    scan = ProcessScan(AdoptionRules(), on_change=lambda: None)
    await scan.rescan([(root, "engine")])
    children = sorted(p for p in tree.pids() if p != root)
    assert sorted(p for p, o in scan.scanned.items() if o.root_pid == root and o.depth) \
        == children
    with reaping_orphans():
        for pid in [root, *children]:
            tree.handles[pid].send_signal(signal.SIGKILL)
        wait_for(lambda: psutil.Process(root).status() == psutil.STATUS_ZOMBIE or None,
                 what="root a zombie")
        # The children, orphaned by the root's death, are ours now, and reaped at once as an
        # init reaps them: no zombie of theirs is left for a session or group rule to find,
        # only the earlier listing knows them.
        for pid in children:
            wait_for(functools.partial(orphaned_to_us, pid), what=f"{pid} orphaned to us")
            wait_for(functools.partial(reaped, pid), what=f"{pid} dead and reaped")
        assert not any(alive(p) or psutil.pid_exists(p) for p in children)

    await scan.rescan([(root, "engine")])
    scan.root_exited(root, started)
    remnants = scan.kill_remnants([])

    assert sorted(o.pid for o in remnants) == children
    tree.root.wait(timeout=30)
