"""Processes a scan listed under a root that the kill never found: reported, never dropped."""

from __future__ import annotations

import signal

from coordinator.kill import procfs
from coordinator.kill.listed import listed_not_found, still_running
from coordinator.kill.policy import Target
from coordinator.kill.report import Fate, ProcessOutcome
from tests.support.processes import ProcessJanitor

SLEEPER = ["-c", "import time; time.sleep(600)"]


def listed(pid: int) -> ProcessOutcome:
    start = procfs.start_time(pid)
    assert start is not None
    return ProcessOutcome(pid=pid, name="python", root_pid=1, depth=1, start_time=start)


def test_a_listed_process_is_gone_survived_or_left_to_the_kill(janitor: ProcessJanitor) -> None:
    """1. three processes listed under a root: one ended and reaped, one still running, one
    the kill found itself; 2. the ended one is ``gone``, the running one ``survived`` (both
    naming the root), the found one is not reported twice."""
    ended = janitor.spawn_python(SLEEPER)
    running = janitor.spawn_python(SLEEPER, service=True, exit_code=-signal.SIGTERM)
    found = janitor.spawn_python(SLEEPER, service=True, exit_code=-signal.SIGTERM)
    entries = [listed(ended.pid), listed(running.pid), listed(found.pid)]
    ended.kill()
    assert ended.wait(timeout=30) == -signal.SIGKILL
    target = Target(pid=4_000_000, listed=tuple(entries))
    out = listed_not_found([target], [entries[2]])
    fates = {o.pid: (o.fate, o.detail) for o in out}
    assert set(fates) == {ended.pid, running.pid}
    assert fates[ended.pid][0] is Fate.GONE
    assert fates[running.pid][0] is Fate.SURVIVED
    assert all("listed under pid 4000000 before the kill" in (d or "") for _, d in fates.values())
    assert still_running(out)
    assert not still_running([o for o in out if o.pid == ended.pid])
