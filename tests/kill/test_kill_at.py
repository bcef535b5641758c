"""``kill_at``: the time each signalled process is told its SIGKILL comes, and that the kill
keeps to it (``coordinator/kill/engine.py`` step 5)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from coordinator.kill import Fate, KillPolicy, ProcessOutcome, Target, terminate
from tests.kill.helpers import start_time, start_tree
from tests.support.processes import ProcessJanitor

CLOCK_SLACK_S = 0.05
"""Between two readings of the wall clock around one signal (kill_at is stamped just before
the tier's first signal, signalled_at just before each signal)."""


async def test_a_cut_tier_announces_the_cut_wait_and_sigkills_no_earlier(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree whose child ignores SIGTERM; tier timeout 10 s, deadline 3 s; 2. terminate;
    3. the child's ``kill_at`` is its SIGTERM plus the wait the kill allotted its tier (the
    one its detail names, cut far below the timeout so the root keeps its share), within the
    deadline; 4. its SIGKILL came at ``kill_at``, not before; 5. the root, the last tier, was
    told a ``kill_at`` too and exited before it."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True}]},
                      tmp_path)
    started = time.time()
    report = await terminate([Target(tree.pid)],
                             KillPolicy(tier_timeout_s=10, deadline_s=3, confirm_s=0.5))
    outcomes = {o.pid: o for o in report.processes}
    child = outcomes[tree.pids("stubborn")[0]]
    assert child.fate is Fate.KILLED
    assert child.signalled_at is not None
    assert child.kill_at is not None
    assert child.killed_at is not None
    found = re.fullmatch(r"still running ([\d.]+)s after SIGTERM", child.detail)
    assert found, child.detail
    wait_s = float(found[1])
    assert wait_s < 10
    assert abs(child.kill_at - (child.signalled_at + wait_s)) <= CLOCK_SLACK_S
    assert child.kill_at <= started + 3
    assert child.killed_at >= child.kill_at - CLOCK_SLACK_S
    root = outcomes[tree.pid]
    assert root.fate is Fate.EXITED
    assert root.kill_at is not None
    assert root.signalled_at is not None
    assert root.ended_at is not None
    assert root.signalled_at - CLOCK_SLACK_S <= root.kill_at
    assert root.ended_at <= root.kill_at
    assert tree.root.wait(timeout=30) == 0


async def test_a_resumed_tier_announces_the_sigkill_of_its_first_signal(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree whose child ignores SIGTERM; 2. a previous run had SIGTERMed the child 0.8 s
    ago with a 1 s tier timeout (``prior``); 3. terminate with that prior; 4. the child's
    ``kill_at`` is that first SIGTERM plus the tier's timeout (the tier's clock kept), and its
    SIGKILL came no earlier."""
    tree = start_tree(janitor, {"children": [{"role": "stubborn", "ignore_term": True}]},
                      tmp_path)
    (child,) = tree.pids("stubborn")
    os.kill(child, signal.SIGTERM)
    signalled_at = time.time() - 0.8
    prior = {(child, start_time(child)): ProcessOutcome(
        pid=child, name="python", start_time=start_time(child), tier="depth-1",
        signal="SIGTERM", signalled_at=signalled_at)}
    report = await terminate(
        [Target(tree.pid)], KillPolicy(tier_timeout_s=1.0, deadline_s=600), prior=prior)
    outcome = {o.pid: o for o in report.processes}[child]
    assert outcome.fate is Fate.KILLED
    assert outcome.kill_at is not None
    assert outcome.killed_at is not None
    assert abs(outcome.kill_at - (signalled_at + 1.0)) <= CLOCK_SLACK_S
    assert outcome.killed_at >= outcome.kill_at - CLOCK_SLACK_S
    assert tree.root.wait(timeout=30) == 0
