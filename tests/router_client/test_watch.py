"""router_client.Watcher against a real coordinator: the router view, batched and early acks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from router_client import Watcher
from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor


async def test_watcher_sees_the_drain_and_acks_early_and_late_handoffs_in_one_call(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A coordinator with one registered worker (reporting 2 in flight); a Watcher maps
       the worker's URL to it.
    2. POST /drain wait=false: the Watcher reports the worker draining.
    3. The worker hands back r1 (listed); the Watcher sees it as handed back.
    4. Three concurrent acks from the router (r1 listed, r2 not reported yet, r1 again) all
       return what they asked for: r1 was acknowledged, r2 remembered early.
    5. The worker now reports r2 with 0 in flight: it is never listed, the counts say 2
       handed back, 2 acknowledged, and the drain moves on to done."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    worker = register(running, start_tree(janitor, tmp_path, children=1)["pid"],
                      url="http://w1")
    report = f"{running.url}/workers/{worker['id']}/report"
    async with httpx.AsyncClient(timeout=30) as http, Watcher(
            {"http://w1": running.url}) as watcher:
        await http.post(report, json={"inflight": 2})
        assert (await http.post(f"{running.url}/drain", json={"wait": False})).status_code == 202
        assert await watcher.wait_for(lambda: watcher.is_draining("http://w1"), 30)
        await http.post(report, json={"handoffs": [{"request_id": "r1", "tokens": 3}]})
        assert await watcher.wait_for(lambda: watcher.handed_back("r1") is not None, 30)
        answers = await asyncio.gather(watcher.ack(["r1"]), watcher.ack(["r2"]),
                                       watcher.ack(["r1"]))
        assert list(answers) == [["r1"], ["r2"], ["r1"]]
        await http.post(report, json={"inflight": 0,
                                      "handoffs": [{"request_id": "r2", "tokens": 5}]})
        summary = (await http.get(f"{running.url}/drain", timeout=60)).json()
    assert summary["phase"] == "done"
    assert summary["migrations"] == []
    counts = summary["migration_counts"]
    assert (counts["handed_back"], counts["acked"], counts["expired"]) == (2, 2, 0)
