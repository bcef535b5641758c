"""The expiry sweep as a pure function of the coordinator's state and a clock reading: it acts
only while serving, and never forgets a worker whose leftovers still run."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from coordinator.drain.phases import Phase
from coordinator.service import expiry
from coordinator.service.metrics import CoordinatorMetrics
from coordinator.service.migrations import MigrationBook
from coordinator.service.registry import Worker
from coordinator.service.worker_moves import WorkerState


@dataclass
class FakeCoordinator:
    phase: Phase = Phase.SERVING
    workers: dict[str, Worker] = field(default_factory=dict)
    listed_roots: set[int] = field(default_factory=set)
    forgotten: list[str] = field(default_factory=list)
    bumps: int = 0

    def __post_init__(self) -> None:
        self.machine = SimpleNamespace(phase=self.phase)
        self.settings = SimpleNamespace(expire_after_s=60.0)
        self.migrations = MigrationBook()
        self.metrics = CoordinatorMetrics()
        self.registry = SimpleNamespace(workers=self.workers)
        self.scan = SimpleNamespace(scanned={
            pid: SimpleNamespace(root_pid=pid) for pid in self.listed_roots})

    def deregister(self, worker_id: str) -> None:
        self.forgotten.append(worker_id)
        del self.workers[worker_id]

    def bump(self) -> None:
        self.bumps += 1


def exited(worker_id: str, pid: int, at: float | None) -> Worker:
    return Worker(id=worker_id, pid=pid, start_time=1.0, role="r", name="n", url=None,
                  state=WorkerState.EXITED, exited_at=at)


def run(fake: FakeCoordinator, now: float) -> expiry.Swept:
    return expiry.sweep(cast(Any, fake), now)


def test_old_handoffs_acks_and_bare_exited_workers_expire_while_serving() -> None:
    fake = FakeCoordinator(workers={
        "old": exited("old", 10, at=100.0),
        "young": exited("young", 11, at=150.0),
        "unknown-exit": exited("unknown-exit", 12, at=None),
        "alive": Worker(id="alive", pid=13, start_time=1.0, role="r", name="n", url=None),
        "left-something": exited("left-something", 14, at=100.0),
    }, listed_roots={14})
    fake.migrations.add("w", None, "h-old", 1)
    fake.migrations.pending["h-old"].handed_back_at = 100.0
    fake.migrations.ack(["e-old"])
    fake.migrations.early["e-old"] = 100.0
    swept = run(fake, now=200.0)
    assert swept == expiry.Swept(handoffs=1, early_acks=1, workers=1)
    assert fake.forgotten == ["old"]
    assert fake.migrations.expired == 1
    assert fake.bumps == 1
    assert fake.metrics.migrations.labels("expired")._value.get() == 1
    assert run(fake, now=200.0) == expiry.Swept()
    assert fake.bumps == 1


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.SERVING])
def test_nothing_expires_during_a_drain(phase: Phase) -> None:
    fake = FakeCoordinator(phase=phase, workers={"old": exited("old", 10, at=1.0)})
    fake.migrations.add("w", None, "h", 1)
    fake.migrations.pending["h"].handed_back_at = 1.0
    assert run(fake, now=1e6) == expiry.Swept()
    assert list(fake.migrations.pending) == ["h"]
    assert fake.forgotten == []


def test_the_sweep_interval_is_a_quarter_of_the_expiry_at_most_five_seconds() -> None:
    assert expiry.interval(0.4) == pytest.approx(0.1)
    assert expiry.interval(60.0) == expiry.MAX_INTERVAL_S
