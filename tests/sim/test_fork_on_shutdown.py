"""A child that starts a helper process while it shuts down."""

from __future__ import annotations

import os
import signal

import psutil

from tests.sim.conftest import StartEngine
from tests.sim.support import wait_ended, wait_record
from tests.support.processes import wait_for


def test_scheduler_starts_a_helper_and_waits_for_it(start_sim: StartEngine) -> None:
    """1. Start with --fork-on-shutdown scheduler:0, no watchdog. 2. SIGTERM scheduler 0.
    3. A helper appears as its child (its record names it) while the scheduler's cleanup
    has started but not finished. 4. SIGTERM the helper. 5. The helper finishes, then the
    scheduler finishes (exit 0)."""
    engine = start_sim(fork_on_shutdown=("scheduler:0",), watchdog=False)
    scheduler = engine.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGTERM)
    record = wait_for(
        lambda: (r := engine.record_of(scheduler)) and r["children"] and r,
        what="the scheduler to start its helper",
    )
    (helper,) = record["children"]
    wait_record(engine, helper, role="helper", ppid=scheduler, pdeathsig=None)
    assert psutil.Process(helper).ppid() == scheduler
    assert record["cleanup"] == "started"
    assert "-m devstack.sim.helper" in " ".join(psutil.Process(helper).cmdline())

    os.kill(helper, signal.SIGTERM)
    helper_end = wait_ended(engine, helper)
    scheduler_end = wait_ended(engine, scheduler)
    assert (helper_end["cleanup"], helper_end["exit_code"]) == ("finished", 0)
    assert (scheduler_end["cleanup"], scheduler_end["exit_code"]) == ("finished", 0)
    assert helper_end["ended_at"] <= scheduler_end["ended_at"]
    # The other scheduler was never involved.
    other = engine.record_of(engine.pids("scheduler")[1])
    assert other is not None
    assert other["signal"] is None
