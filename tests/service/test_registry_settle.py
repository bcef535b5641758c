"""A worker whose process died is an exited worker as soon as the kill asks, even when the
event loop has not delivered the exit yet."""

from __future__ import annotations

import signal

import psutil

from coordinator.kill.identity import facts
from coordinator.service.registry import WorkerRegistry
from tests.support.processes import ProcessJanitor, wait_for


async def test_settle_marks_a_worker_that_died_before_the_loop_noticed(
    janitor: ProcessJanitor,
) -> None:
    """1. register a sleeper (its pidfd watched on the loop); 2. SIGKILL it and wait, without
    yielding to the loop, until it is a zombie: the exit callback is still queued; 3. the
    registry still calls it alive; 4. ``settle`` marks it exited, with the exit status its
    pidfd gives (-9), and tells the exit hook once."""
    sleeper = janitor.spawn(["sleep", "600"])
    exits: list[int] = []
    registry = WorkerRegistry(on_change=lambda: None, on_exit=lambda w: exits.append(w.pid))
    worker, _ = registry.register(facts(sleeper.pid), role="engine", name=None, url=None,
                                  tiers=(), include_tree=True)
    sleeper.send_signal(signal.SIGKILL)
    wait_for(lambda: psutil.Process(sleeper.pid).status() == psutil.STATUS_ZOMBIE or None,
             what="the sleeper a zombie")
    assert registry.alive() == [worker]  # the loop has not run the exit callback

    registry.settle()

    assert registry.alive() == []
    assert worker.exit_code == -signal.SIGKILL
    assert exits == [sleeper.pid]
    registry.settle()
    assert exits == [sleeper.pid]
    registry.close()
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
