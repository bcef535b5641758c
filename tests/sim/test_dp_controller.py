"""The data-parallel controller and its PDEATHSIG schedulers."""

from __future__ import annotations

import os
import signal

from tests.sim.conftest import StartEngine
from tests.sim.support import wait_ended, wait_gone, wait_record


def test_killing_the_controller_kills_its_schedulers_mid_cleanup(start_sim: StartEngine) -> None:
    """1. Start with --dp 2, no watchdog, a 30 s teardown. 2. SIGTERM both schedulers and
    wait until both record that their cleanup started. 3. SIGKILL the controller.
    4. PDEATHSIG SIGKILLs both schedulers: they are gone, and their records still say
    "started" — the cleanup never finished."""
    engine = start_sim(dp=2, watchdog=False, teardown_s=30)
    (controller,) = engine.pids("dp_controller")
    schedulers = engine.pids("scheduler")
    assert len(schedulers) == 2
    for pid in schedulers:
        os.kill(pid, signal.SIGTERM)
    for pid in schedulers:
        wait_record(engine, pid, cleanup="started")
    os.kill(controller, signal.SIGKILL)
    wait_gone(*schedulers)
    for pid in schedulers:
        record = engine.record_of(pid)
        assert record is not None
        assert (record["cleanup"], record["cleanup_finished_at"], record["ended_at"]) == (
            "started", None, None,
        )  # fmt: skip


def test_controller_stops_its_schedulers_before_it_exits(start_sim: StartEngine) -> None:
    """1. Start with --dp 2, a short teardown and no watchdog.
    2. SIGTERM the controller. 3. It passes SIGTERM on, waits for both schedulers, then
    runs its own teardown and exits 0. 4. Both schedulers finished their cleanup (exit 0)
    before the controller ended."""
    engine = start_sim(dp=2, watchdog=False, teardown_s=0.2)
    (controller,) = engine.pids("dp_controller")
    schedulers = engine.pids("scheduler")
    assert len(schedulers) == 2
    os.kill(controller, signal.SIGTERM)
    end = wait_ended(engine, controller)
    assert (end["cleanup"], end["exit_code"]) == ("finished", 0)
    assert end["children_exit_codes"] == {str(pid): 0 for pid in schedulers}
    for pid in schedulers:
        record = engine.record_of(pid)
        assert record is not None
        assert (record["signal"], record["cleanup"], record["exit_code"]) == (
            "SIGTERM", "finished", 0,
        )  # fmt: skip
        assert record["ended_at"] <= end["cleanup_finished_at"]
    wait_record(engine, engine.pid, children_exit_codes={str(controller): 0})


def test_without_propagation_the_schedulers_die_uncleanly(start_sim: StartEngine) -> None:
    """1. Start with --dp 2 --dp-no-propagate and a short teardown, no watchdog.
    2. SIGTERM the controller. 3. It finishes its own cleanup and exits 0. 4. Its
    schedulers, never told, are SIGKILLed by PDEATHSIG: gone, no signal, no cleanup."""
    engine = start_sim(dp=2, dp_no_propagate=True, watchdog=False, teardown_s=0.2)
    (controller,) = engine.pids("dp_controller")
    schedulers = engine.pids("scheduler")
    assert len(schedulers) == 2
    os.kill(controller, signal.SIGTERM)
    end = wait_ended(engine, controller)
    assert (end["cleanup"], end["exit_code"]) == ("finished", 0)
    wait_gone(*schedulers)
    for pid in schedulers:
        record = engine.record_of(pid)
        assert record is not None
        assert (record["signal"], record["cleanup"], record["ended_at"]) == (
            None, "not started", None,
        )  # fmt: skip
