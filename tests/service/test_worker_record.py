"""A registered worker survives the state file: its record round-trips whole."""

from __future__ import annotations

import signal

from coordinator.kill.policy import TierSpec
from coordinator.service.registry import Worker


def test_worker_record_round_trips_its_tiers() -> None:
    """1. A worker with two declared tiers, one of which holds the root.
    2. to_record() then from_record(): same tiers (signal, timeout, include_root), same id."""
    tiers = (TierSpec("engine-core", pattern="EngineCore", timeout_s=20.0),
             TierSpec("main", roles=("worker",), signal=signal.SIGINT, include_root=True))
    worker = Worker(id="w-1", pid=4242, start_time=1767000000.5, role="worker", name="engine",
                    url="http://127.0.0.1:8000", tiers=tiers)
    back = Worker.from_record(worker.to_record())
    assert back.id == worker.id
    assert back.tiers == tiers
