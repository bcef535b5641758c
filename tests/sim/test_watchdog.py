"""The main process's child watchdog: a dead child takes the whole tree down, unless the
watchdog was stood down (or is off)."""

from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest

from devstack.sim import expected_tokens
from tests.sim.conftest import STOP_TIMEOUT_S, StartEngine
from tests.sim.support import is_gone, wait_gone, wait_record


def test_a_dead_child_makes_the_watchdog_kill_the_tree(start_sim: StartEngine) -> None:
    """1. Start the engine, watchdog armed. 2. SIGKILL scheduler rank 1. 3. The main process
    dies by SIGKILL (exit 137) and takes the other scheduler and the detokenizer with it.
    4. Main's record says its cleanup was interrupted by the watchdog; the survivors never
    started theirs."""
    engine = start_sim()
    victim = engine.pids("scheduler")[1]
    others = [p.pid for p in engine.processes[1:] if p.pid != victim]
    assert len(others) == 2  # the other scheduler and the detokenizer
    os.kill(victim, signal.SIGKILL)

    assert engine.proc.wait(timeout=STOP_TIMEOUT_S) == -signal.SIGKILL
    wait_gone(*others)
    main = engine.record_of(engine.pid)
    assert main is not None
    assert main["cleanup"] == "interrupted"
    assert main["detail"].startswith(f"watchdog: scheduler {victim} exited with -9")
    for pid in others:
        record = engine.record_of(pid)
        assert record is not None
        assert (record["cleanup"], record["ended_at"]) == ("not started", None)


@pytest.mark.parametrize("how", ["stand_down", "off"])
async def test_a_stood_down_watchdog_lets_a_child_go(start_sim: StartEngine, how: str) -> None:
    """1. Start the engine; stand its watchdog down over HTTP (or start it without one).
    2. SIGKILL scheduler rank 1. 3. Main notes the exit (-9) in its record — the watchdog's
    decision is made before that. 4. Main still serves a full stream; the other children
    still run."""
    engine = start_sim(watchdog=(how != "off"))
    async with httpx.AsyncClient(timeout=30) as client:
        if how == "stand_down":
            answer = await client.post(f"{engine.url}/internal/stand_down")
            assert answer.json() == {"watchdog": "stood_down"}
        health = (await client.get(f"{engine.url}/health")).json()
        assert health["watchdog"] == ("stood_down" if how == "stand_down" else "off")

        victim = engine.pids("scheduler")[1]
        os.kill(victim, signal.SIGKILL)
        wait_record(engine, engine.pid, children_exit_codes={str(victim): -signal.SIGKILL})

        assert engine.proc.poll() is None
        response = await client.post(
            f"{engine.url}/v1/completions", json={"prompt": "still here", "max_tokens": 4}
        )
    assert response.json()["choices"][0]["text"] == "".join(expected_tokens("still here", 4))
    assert is_gone(victim)
    for p in engine.processes[1:]:
        if p.pid != victim:
            assert psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE
