"""The router adapters' policies and settings, without a router and without sleeping: the
time budget, the retries on a fake clock, what each router's answers mean, and the refusals
of ``serve`` in the operator's words."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from pydantic import ValidationError

from coordinator import startup_check
from coordinator.cli.entry import main
from coordinator.exit_codes import USAGE
from coordinator.router_settings import RouterSpec, RouterSyntaxError, parse_router
from coordinator.service import router_adapters as ra
from coordinator.service.metrics import CoordinatorMetrics
from coordinator.service.render import status_text
from coordinator.settings import Settings

WORKER = "http://10.0.0.7:8000"
SMG = "http://smg:30000"
VLLM = "http://vllm-router:8000"


class FakeClock:
    """Monotonic time that only ``sleep`` moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# --- the budget and the retry policy ----------------------------------------------------------

def test_a_call_gets_its_budget_but_never_past_the_migration_deadline() -> None:
    """1. no drain (an abort's restore): the whole budget; 2. a migration deadline far off:
    the budget; 3. one closer than the budget: up to it; 4. one already past: no time."""
    assert ra.call_deadline(50.0, 9000.0, None) == 50.0 + ra.CALL_BUDGET_S
    assert ra.call_deadline(50.0, 9000.0, 9100.0) == 50.0 + ra.CALL_BUDGET_S
    assert ra.call_deadline(50.0, 9000.0, 9001.5) == 51.5
    assert ra.call_deadline(50.0, 9000.0, 8990.0) == 50.0


async def _attempts(deadline: float, clock: FakeClock, fail: Callable[[int], None]) -> int:
    attempts = 0
    async for attempt in ra.retrying(deadline, clock, clock.sleep):
        with attempt:
            attempts += 1
            fail(attempts)
    return attempts


async def test_retries_back_off_and_stop_before_the_deadline() -> None:
    """1. every attempt fails in a way that may pass; 2. the waits double from 20 ms and are
    capped at 500 ms; 3. no attempt starts at or past the deadline, and the last failure is
    raised as it was."""
    clock = FakeClock()
    deadline = clock.now + ra.CALL_BUDGET_S

    def fail(n: int) -> None:
        raise ra.Retryable(f"attempt {n}")

    with pytest.raises(ra.Retryable) as raised:
        await _attempts(deadline, clock, fail)
    slept = clock.slept
    assert slept[:5] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32])
    assert max(slept) == ra.MAX_WAIT_S
    assert clock.now < deadline
    assert raised.value.args == (f"attempt {len(slept) + 1}",)


async def test_a_loading_engine_is_asked_again_sooner_than_a_failing_router() -> None:
    """A join's waits (cap ``JOIN_MAX_WAIT_S``) by cause: 1. twelve attempts find the engine
    loading: the waits double from 20 ms up to ``LOADING_MAX_WAIT_S`` and stay there;
    2. then the router fails twelve times: the waits grow on to ``JOIN_MAX_WAIT_S``."""
    clock = FakeClock()

    def loading_then_router_down(n: int) -> None:
        if n <= 12:
            raise ra.EngineLoading("the engine does not answer yet")
        if n <= 24:
            raise ra.Retryable("not reachable")

    attempts = 0
    async for attempt in ra.retrying(clock.now + ra.JOIN_BUDGET_S, clock, clock.sleep,
                                     ra.JOIN_MAX_WAIT_S):
        with attempt:
            attempts += 1
            loading_then_router_down(attempts)
    assert attempts == 25
    loading, router_down = clock.slept[:12], clock.slept[12:]
    assert loading[:4] == pytest.approx([0.02, 0.04, 0.08, 0.16])
    assert loading[4:] == [ra.LOADING_MAX_WAIT_S] * 8
    assert router_down[-1] == ra.JOIN_MAX_WAIT_S
    assert max(loading) < ra.JOIN_MAX_WAIT_S


async def test_a_refusal_is_not_retried_and_a_passing_failure_is() -> None:
    """1. a refusal (a 4xx) on the first attempt: one attempt, no wait; 2. two failures that
    may pass, then success: three attempts, two waits."""
    clock = FakeClock()

    def refuse(_n: int) -> None:
        raise ra.Refused("answered 401")

    with pytest.raises(ra.Refused):
        await _attempts(clock.now + 3, clock, refuse)
    assert clock.slept == []

    def twice(n: int) -> None:
        if n < 3:
            raise ra.Retryable("not reachable")

    assert await _attempts(clock.now + 3, clock, twice) == 3
    assert len(clock.slept) == 2


# --- what each router's answers mean, over a fake transport -----------------------------------

def _adapters(specs: list[RouterSpec],
              handler: Callable[[httpx.Request], httpx.Response]
              | Callable[[httpx.Request], Coroutine[None, None, httpx.Response]],
              clock: FakeClock, token: str | None = None) -> tuple[ra.RouterAdapters,
                                                                   CoordinatorMetrics]:
    metrics = CoordinatorMetrics()
    adapters = ra.RouterAdapters(specs, WORKER, token, metrics, on_change=lambda: None,
                                 clock=clock, sleep=clock.sleep)
    adapters._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return adapters, metrics


async def _settle(adapters: ra.RouterAdapters) -> None:
    await asyncio.gather(*adapters._tasks.values())


def _count(metrics: CoordinatorMetrics, router: str, action: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "shutdown_coordinator_router_calls_total",
        {"router": router, "action": action, "result": result})
    return value or 0.0


async def test_an_unreachable_router_fails_within_its_budget() -> None:
    """1. the router refuses every connection; 2. a drain's removal retries until its budget
    (cut to the migration deadline, 1 s away) and fails; 3. /status says failed, with the
    attempts and the error; the metrics count one failed removal."""
    clock = FakeClock()

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    adapters, metrics = _adapters([RouterSpec("vllm-router", VLLM)], refused, clock)
    started = clock.now
    adapters.drain_started(time.time() + 1.0)
    await _settle(adapters)
    state = adapters.to_status()[0]
    assert state["state"] == "failed"
    assert state["action"] == "remove"
    assert state["attempts"] > 2
    assert "not reachable (ConnectError" in state["error"]
    assert clock.now - started <= 1.0
    assert _count(metrics, "vllm-router", "remove", "failed") == 1
    await adapters.close()


async def test_smg_removal_finds_the_id_by_url_and_restore_waits_for_the_settle() -> None:
    """1. smg lists the worker ready: the removal sets its settle time, then deletes it by the
    id listed for the worker's URL, with the control-plane key; 2. an abort while smg still
    lists it draining waits (retries) until it left, then adds it back by URL."""
    clock = FakeClock()
    calls: list[tuple[str, str, Any]] = []
    listed = {"status": "ready"}

    def smg(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer key"
        body = json.loads(request.content) if request.content else None
        calls.append((request.method, request.url.path, body))
        if request.method == "GET":
            workers = [{"id": "other", "url": "http://10.0.0.8:8000", "status": "ready"}]
            if listed["status"] != "gone":
                workers.append({"id": "w-1", "url": WORKER + "/", "status": listed["status"]})
            polls = sum(1 for c in calls if c[0] == "GET")
            if listed["status"] == "draining" and polls >= 4:
                listed["status"] = "gone"  # smg's settle time ended
            return httpx.Response(200, json={"workers": workers})
        if request.method == "DELETE":
            listed["status"] = "draining"
        return httpx.Response(202, json={"status": "accepted"})

    adapters, metrics = _adapters([RouterSpec("smg", SMG)], smg, clock, token="key")
    adapters.drain_started(time.time() + 60)
    await _settle(adapters)
    assert [c[:2] for c in calls] == [("GET", "/workers"), ("PATCH", "/workers/w-1"),
                                      ("DELETE", "/workers/w-1")]
    assert calls[1][2] == {"health": {"drain_settle_secs": ra.SMG_SETTLE_S}}
    assert adapters.to_status()[0]["state"] == "removed"
    calls.clear()
    adapters.drain_aborted()
    await _settle(adapters)
    assert calls[-1] == ("POST", "/workers", {"url": WORKER})
    assert [c[0] for c in calls[:-1]] == ["GET"] * (len(calls) - 1)
    state = adapters.to_status()[0]
    assert (state["state"], state["note"]) == ("restored", "added back")
    assert state["attempts"] == len(calls) - 1
    assert _count(metrics, "smg", "remove", "ok") == _count(metrics, "smg", "restore", "ok") == 1
    await adapters.close()


async def test_vllm_router_already_done_is_success_and_a_refusal_fails_at_once() -> None:
    """1. add_worker answered 400 "already exists": restored; 2. remove_worker answered 403:
    failed after one attempt; 3. the reference router is never called, only watched."""
    clock = FakeClock()
    seen: list[str] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.path}?{request.url.query.decode()}")
        if request.url.path == "/add_worker":
            return httpx.Response(400, text=f"Worker {WORKER} already exists")
        return httpx.Response(403, text="forbidden")

    adapters, metrics = _adapters([RouterSpec("vllm-router", VLLM),
                                   RouterSpec("reference", "http://ref:1")], vllm, clock)
    adapters.drain_aborted()
    await _settle(adapters)
    assert adapters.to_status()[0]["state"] == "restored"
    adapters.drain_started(time.time() + 60)
    await _settle(adapters)
    vllm_state, reference = adapters.to_status()
    assert (vllm_state["state"], vllm_state["attempts"]) == ("failed", 1)
    assert vllm_state["error"] == "answered 403: forbidden"
    query = urlencode({"url": WORKER})
    assert seen == [f"/add_worker?{query}", f"/remove_worker?{query}"]
    assert reference["state"] == "watching"
    assert _count(metrics, "reference", "remove", "not_needed") == 1
    await adapters.close()


async def test_joining_waits_for_the_engine_health_then_adds_it_and_a_drain_cancels_it() -> None:
    """1. join: the engine's /health is not listening yet, then answers 503 (loading), then
    200; only then is smg asked, and the engine added by URL; /status says joined; while the
    engine loads, the waits are capped at ``LOADING_MAX_WAIT_S``;
    2. join again while the engine's health does not answer yet, then a drain starts: the
    join is cancelled (never added) and the drain's removal runs; the metrics count one join
    ok and one cancelled."""
    clock = FakeClock()
    health: dict[str, list[int]] = {"answers": [0, 503, 200]}  # 0: connection refused
    calls: list[tuple[str, str]] = []
    asked, never = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, str(request.url)))
        if str(request.url) == f"{WORKER}/health":
            answers = health["answers"]
            if not answers:  # an engine still loading, that has not answered yet
                asked.set()
                await never.wait()
            answer = answers.pop(0)
            if answer == 0:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(answer)
        if request.method == "GET":
            return httpx.Response(200, json={"workers": []})
        return httpx.Response(202, json={"status": "accepted"})

    adapters, metrics = _adapters([RouterSpec("smg", SMG)], handler, clock)
    adapters.join()
    await _settle(adapters)
    assert calls == [("GET", f"{WORKER}/health")] * 3 + [
        ("GET", f"{SMG}/workers"), ("POST", f"{SMG}/workers")]
    state = adapters.to_status()[0]
    assert (state["state"], state["action"], state["note"]) == ("joined", "join", "added back")
    assert state["attempts"] == 3

    assert clock.slept == pytest.approx([0.02, 0.04])

    calls.clear()
    health["answers"] = [503] * 10
    adapters.join()
    await asyncio.wait_for(asked.wait(), 10)
    assert max(clock.slept) == ra.LOADING_MAX_WAIT_S
    adapters.drain_started(time.time() + 60)
    await _settle(adapters)
    assert ("POST", f"{SMG}/workers") not in calls
    assert adapters.to_status()[0]["state"] == "removed"
    assert _count(metrics, "smg", "join", "ok") == 1
    assert _count(metrics, "smg", "join", "cancelled") == 1
    await adapters.close()


# --- settings ---------------------------------------------------------------------------------

def test_routers_are_read_from_flags_and_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1. ``KIND=URL`` strings, a trailing slash dropped; 2. the variable, comma-separated;
    3. a kind or URL that cannot be understood says what is wrong."""
    assert parse_router("smg=http://smg:30000/") == RouterSpec("smg", SMG)
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_ROUTERS", f"smg={SMG}, vllm-router={VLLM}")
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL", WORKER)
    settings = Settings()
    assert settings.routers == [RouterSpec("smg", SMG), RouterSpec("vllm-router", VLLM)]
    assert settings.router_worker_url == WORKER
    for text, says in [("nginx=http://x", "unknown router kind 'nginx'"),
                       ("smg", "is not KIND=URL"), ("smg=ftp://x", "not an http://"),
                       ("smg=http://x:99999", "not a URL")]:
        with pytest.raises(RouterSyntaxError, match=says):
            parse_router(text)


def test_router_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    """1. smg or vllm-router without a worker URL; 2. an empty or missing key file: each a
    refusal naming the flag and its variable; 3. the reference router alone needs neither."""
    refused = startup_check.refusals(Settings(routers=[f"smg={SMG}", f"vllm-router={VLLM}"]))
    assert refused == [
        "--router smg, vllm-router needs --router-worker-url (env "
        "SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL): the engine's URL as the router knows it "
        "(http://POD_IP:PORT), or the router cannot be told which worker drains"]
    empty = tmp_path / "key"
    empty.write_text(" \n")
    for path, says in [(empty, "is empty"), (tmp_path / "none", "cannot be read")]:
        [problem] = startup_check.refusals(Settings(
            routers=[f"smg={SMG}"], router_worker_url=WORKER, router_token_file=path))
        assert problem.startswith(
            f"--router-token-file {path} (env SHUTDOWN_COORDINATOR_ROUTER_TOKEN_FILE)")
        assert says in problem
    assert startup_check.refusals(Settings(routers=["reference=http://ref:1"])) == []
    with pytest.raises(ValidationError):
        Settings(router_worker_url="10.0.0.7:8000")


def test_serve_refuses_bad_router_flags_before_listening(
        capsys: pytest.CaptureFixture[str]) -> None:
    """1. ``serve --router nginx=…``: usage exit code, the flag and variable named;
    2. ``serve --router smg=… --router-worker-url not-a-url``: the same for that flag."""
    assert main(["serve", "--router", "nginx=http://x:1"]) == USAGE
    err = capsys.readouterr().err
    assert "--router (env SHUTDOWN_COORDINATOR_ROUTERS): 'nginx=http://x:1': unknown router " \
        "kind 'nginx'" in err
    assert main(["serve", "--router", f"smg={SMG}", "--router-worker-url", "pod:8000"]) == USAGE
    err = capsys.readouterr().err
    assert "--router-worker-url (env SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL): 'pod:8000'" in err


def test_the_status_text_says_what_each_router_adapter_did() -> None:
    """One line per router: its kind, address and state, the attempts and time it took, and
    the error of one that failed."""
    doc = {"phase": "migrating", "generation": 4, "migrations": [], "counts": {}, "workers": [],
           "routers": [
               {"kind": "smg", "url": "http://smg:30000", "state": "removed", "attempts": 1,
                "took_ms": 12.4, "error": None},
               {"kind": "vllm-router", "url": "http://vr:8000", "state": "failed",
                "attempts": 3, "took_ms": 3000.0, "error": "not reachable"}]}
    lines = status_text(doc).splitlines()
    assert "router      smg http://smg:30000: removed (1 attempt, 12 ms)" in lines
    assert "router      vllm-router http://vr:8000: failed (3 attempts, 3000 ms): not " \
           "reachable" in lines
