"""router_client.Watcher against a real coordinator: the router view, batched and early acks,
which workers take new work."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx

import shutdown_wire as wire
from devstack.routers import free_port
from router_client import Watcher
from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor, wait_for


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


async def test_an_ack_a_restarted_coordinator_forgot_is_sent_again(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A draining coordinator with a state file and a registered worker; the router
       acknowledges r9 before its handoff is reported (answered ``early``).
    2. The coordinator is SIGKILLed before it saved that acknowledgement (the state file is
       left as such a crash leaves it: without the early ack) and started again on the same
       port and file.
    3. The worker reports r9: the restarted coordinator lists it as waiting for a router;
       the Watcher, having acknowledged r9 already, acknowledges it again.
    4. Nothing expires: the drain ends graceful with 1 handed back, 1 acknowledged, 0 lost
       (without the second ack, r9 would expire at the migration deadline, counted lost,
       though the router continued it)."""
    state = tmp_path / "state.json"
    args = [*FAST, "--grace-period", "60", "--port", str(free_port()), "--state-file",
            str(state)]
    first = start_coordinator(janitor, tmp_path, *args, name="first")
    worker = register(first, start_tree(janitor, tmp_path, children=1)["pid"], url="http://w1")
    async with httpx.AsyncClient(timeout=30) as http, Watcher(
            {"http://w1": first.url}) as watcher:
        report = f"{first.url}/workers/{worker['id']}/report"
        await http.post(report, json={"inflight": 1})
        assert (await http.post(f"{first.url}/drain", json={"wait": False})).status_code == 202
        assert await watcher.wait_for(lambda: watcher.is_draining("http://w1"), 30)
        assert await watcher.ack(["r9"]) == ["r9"]
        wait_for(lambda: json.loads(state.read_text())["migrations"]["early"],
                 what="the early ack on disk")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
        document = json.loads(state.read_text())
        document["migrations"]["early"] = []  # what a crash before the write leaves
        state.write_text(json.dumps(document))

        second = start_coordinator(janitor, tmp_path, *args, name="second")
        await http.post(report, json={"handoffs": [{"request_id": "r9", "tokens": 4}],
                                      "inflight": 0})
        summary = (await http.get(f"{second.url}/drain", timeout=60)).json()
    assert summary["phase"] == "done"
    counts = summary["migration_counts"]
    assert (counts["handed_back"], counts["acked"], counts["expired"]) == (1, 1, 0)
    assert summary["drain"]["lost_requests"] == 0
    assert summary["outcome"] == "graceful", summary["drain"]["causes"]


async def test_a_worker_that_takes_no_work_reads_as_draining_while_its_pod_serves(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A serving coordinator with two registered engines, at http://w1 and http://w2; a
       Watcher maps both to it. Neither reads as draining.
    2. w1's process exits (SIGTERM): the coordinator lists it ``exited`` and stays
       ``serving``.
    3. Once the Watcher has seen that, w1 reads as draining (no new work may go there) and
       w2 does not: the worker's state is judged by the worker states, not by the phases
       (``exited`` is no phase, so it used to read as taking work).
    4. A new engine registers at http://w1 (the engine restarted): w1 takes work again, the
       old ``exited`` entry beside it notwithstanding.
    5. A drain ends both engines (done)."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    first = start_tree(janitor, tmp_path, children=0, tag="w1")
    register(running, first["pid"], url="http://w1")
    register(running, start_tree(janitor, tmp_path, children=0, tag="w2")["pid"],
             url="http://w2")
    urls = {"http://w1": running.url, "http://w2": running.url}
    async with httpx.AsyncClient(timeout=60) as http, Watcher(urls) as watcher:

        async def seen_by_watcher(generation: int) -> None:
            view = watcher.views[running.url]
            assert await watcher.wait_for(lambda: view.generation >= generation, 30)

        status = running.status()
        await seen_by_watcher(status["generation"])
        assert (watcher.is_draining("http://w1"), watcher.is_draining("http://w2")) == (
            False, False)

        os.kill(first["pid"], signal.SIGTERM)
        status = wait_for(lambda: (s := running.status()) and {
            w["url"]: w["state"] for w in s["workers"]}["http://w1"] == wire.WORKER_EXITED
            and s, what="w1 listed as exited")
        assert status["phase"] == wire.PHASE_SERVING
        await seen_by_watcher(status["generation"])
        assert (watcher.is_draining("http://w1"), watcher.is_draining("http://w2")) == (
            True, False)

        register(running, start_tree(janitor, tmp_path, children=0, tag="w1b")["pid"],
                 url="http://w1")
        await seen_by_watcher(running.status()["generation"])
        assert [w["state"] for w in running.status()["workers"] if w["url"] == "http://w1"] \
            == [wire.WORKER_EXITED, wire.WORKER_SERVING]
        assert not watcher.is_draining("http://w1")

        summary = (await http.get(f"{running.url}/drain", timeout=60)).json()
    assert summary["phase"] == wire.PHASE_DONE
    assert summary["outcome"] == "graceful", summary["drain"]["causes"]
