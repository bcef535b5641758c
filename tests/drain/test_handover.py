"""The handover of the main processes' signal to a waiting caller, step by step (no clock)."""

from __future__ import annotations

import asyncio

from coordinator.drain.handover import LEFT_TO_CALLER, Handover


async def test_a_waiting_caller_takes_the_roots_over_and_later_callers_learn_them() -> None:
    handover = Handover()
    first, second = handover.wait(), handover.wait()
    assert handover.waiting == 2
    assert handover.take([10, 11]) == LEFT_TO_CALLER
    assert (first.result(), second.result()) == ([10, 11], [10, 11])
    assert handover.handed == [10, 11]
    late = handover.wait()
    assert late.result() == [10, 11]
    # a second tier of roots (another target) finds nobody waiting: the kill signals it
    assert handover.take([12]) is None
    assert handover.handed == [10, 11]


async def test_without_a_waiting_caller_the_kill_signals_the_roots_itself() -> None:
    handover = Handover()
    assert handover.take([10]) is None
    assert handover.handed is None
    gone = handover.wait()
    handover.forget(gone)
    assert gone.cancelled()
    assert handover.waiting == 0
    assert handover.take([10]) is None


async def test_a_new_drain_starts_with_nothing_handed_over() -> None:
    handover = Handover()
    handover.wait()
    assert handover.take([10]) == LEFT_TO_CALLER
    handover.reset()
    assert handover.handed is None
    waiting = handover.wait()
    await asyncio.sleep(0)
    assert not waiting.done()
