"""The process scan never loses what a crashed root had under it, whichever comes first: the
scan that sees the root dead, or the registry noticing its worker exited."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil

from coordinator.kill.adoption import AdoptionRules
from coordinator.service.process_scan import ProcessScan
from tests.kill.helpers import alive, start_time, start_tree
from tests.support.processes import ProcessJanitor, wait_for

TREE = {"children": [{"role": "scheduler", "children": [{"role": "tp-worker"}]},
                     {"role": "detokenizer"}]}


async def test_a_scan_that_sees_the_root_dead_first_keeps_what_it_had(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a registered root with three descendants, listed by a scan; 2. every process of
    the tree is SIGKILLed (a crash: the children die with the root), the root left a zombie
    (its worker's exit not noticed yet); 3. a scan runs, and only then the root's exit is
    recorded; 4. what the kill takes for that root still holds all three descendants."""
    tree = start_tree(janitor, TREE, tmp_path)
    root = tree.pid
    started = start_time(root)
    scan = ProcessScan(AdoptionRules(), on_change=lambda: None)
    await scan.rescan([(root, "engine")])
    children = sorted(p for p in tree.pids() if p != root)
    assert sorted(p for p, o in scan.scanned.items() if o.root_pid == root and o.depth) \
        == children
    for pid in [root, *children]:
        tree.handles[pid].send_signal(signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in children) or None, what="children dead")
    wait_for(lambda: psutil.Process(root).status() == psutil.STATUS_ZOMBIE or None,
             what="root a zombie")

    await scan.rescan([(root, "engine")])
    scan.root_exited(root, started)
    remnants = scan.kill_remnants([])

    assert sorted(o.pid for o in remnants) == children
    tree.root.wait(timeout=30)
