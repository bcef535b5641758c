"""What SIGTERM to the main process does: stock SGLang behaviour, or --graceful-main."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from devstack.sim import expected_tokens
from tests.sim.conftest import STOP_TIMEOUT_S, StartEngine
from tests.sim.support import read_events, wait_gone, wait_record


def test_stock_main_sigkills_its_tree_and_itself(start_sim: StartEngine) -> None:
    """1. Start the engine (stock) with a long child teardown. 2. SIGTERM the main process.
    3. It exits by SIGKILL (137, the "looks like an OOM" exit). 4. Every child is gone and
    never got a signal or started its cleanup; main's record says it was interrupted."""
    engine = start_sim(teardown_s=30)
    os.kill(engine.pid, signal.SIGTERM)
    assert engine.proc.wait(timeout=STOP_TIMEOUT_S) == -signal.SIGKILL
    wait_gone(*(p.pid for p in engine.processes[1:]))
    records = engine.records()
    assert len(records) == len(engine.processes) == 4
    assert sorted(r["pid"] for r in records) == sorted(p.pid for p in engine.processes)
    for record in records:
        if record["role"] == "main":
            assert (record["signal"], record["cleanup"]) == ("SIGTERM", "interrupted")
            assert record["exit_code"] == -signal.SIGKILL
        else:
            assert (record["signal"], record["cleanup"], record["ended_at"]) == (
                None, "not started", None,
            )  # fmt: skip


@pytest.mark.parametrize("shape", [{"schedulers": 2}, {"dp": 2}], ids=["tp", "dp"])
async def test_graceful_main_hands_back_and_stops_children_first(
    start_sim: StartEngine, shape: dict[str, int]
) -> None:
    """1. Start with --graceful-main and a short teardown; open a 200-token stream.
    2. After 2 tokens, SIGTERM the main process. 3. The stream ends handed back with the
    tokens streamed so far (a correct prefix). 4. Main exits 0. 5. Every process got
    SIGTERM and finished its cleanup with exit 0, every child before main's cleanup ended."""
    engine = start_sim(graceful_main=True, teardown_s=0.2, token_interval_ms=10, **shape)
    async with httpx.AsyncClient(timeout=30) as client:

        async def terminate_after_two(n: int) -> None:
            if n == 2:
                os.kill(engine.pid, signal.SIGTERM)

        body = {"prompt": "p", "max_tokens": 200, "stream": True}
        async with client.stream("POST", f"{engine.url}/v1/completions", json=body) as response:
            tokens, last = await read_events(response, terminate_after_two)
    assert isinstance(last, dict)
    assert last["handed_back"] is True
    assert last["tokens"] == len(tokens)
    assert tokens == expected_tokens("p", len(tokens))

    assert await asyncio.to_thread(engine.proc.wait, STOP_TIMEOUT_S) == 0
    records = engine.records()
    assert len(records) == len(engine.processes)
    assert sorted(r["pid"] for r in records) == sorted(p.pid for p in engine.processes)
    main = next(r for r in records if r["role"] == "main")
    for record in records:
        assert record["signal"] == "SIGTERM", record
        assert (record["cleanup"], record["exit_code"]) == ("finished", 0), record
        if record is not main:
            assert record["ended_at"] <= main["ended_at"]
    assert main["sigkilled_children"] == []


def test_graceful_main_sigkills_a_child_that_ignores_sigterm(start_sim: StartEngine) -> None:
    """1. Start with --graceful-main, scheduler rank 1 ignoring SIGTERM, a 0.5 s child
    timeout. 2. SIGTERM the main process. 3. Main exits 0 after SIGKILLing that scheduler
    only. 4. Its record shows the SIGTERM it ignored and a cleanup that never started; the
    other children finished theirs."""
    engine = start_sim(graceful_main=True, ignore_sigterm=("scheduler:1",), child_timeout_s=0.5)
    stubborn = engine.pids("scheduler")[1]
    os.kill(engine.pid, signal.SIGTERM)
    assert engine.proc.wait(timeout=STOP_TIMEOUT_S) == 0
    main = engine.record_of(engine.pid)
    assert main is not None
    assert main["sigkilled_children"] == [stubborn]
    assert main["children_exit_codes"][str(stubborn)] == -signal.SIGKILL
    record = engine.record_of(stubborn)
    assert record is not None
    assert record["signal"] == "SIGTERM"
    assert record["detail"] == "ignored SIGTERM"
    assert (record["cleanup"], record["ended_at"]) == ("not started", None)
    others = [p.pid for p in engine.processes[1:] if p.pid != stubborn]
    assert len(others) == 2  # the other scheduler and the detokenizer
    for pid in others:
        wait_record(engine, pid, cleanup="finished", exit_code=0)
