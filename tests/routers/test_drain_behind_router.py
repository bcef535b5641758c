"""A pod drained behind a real router (smg, vllm-router) under streaming load, held against
ground truth: what each engine logged it took (``Pod.requests()``, written by the engine
itself as its HTTP handler takes a request), what each client received, and what the drained
pod's coordinator says (``GET /drain``'s summary, its ``routers`` entry and timeline).

Three simulated pods, each an engine and its coordinator, behind the router; six clients
stream completions back to back through it; pod 0 is drained by the preStop hook's call
(``GET /drain``). Side by side:

- the adapter on (``--router``): the coordinator takes the engine out of the router at the
  drain's start, so no request sent after the router was told reaches the drained pod;
- the adapter off (the router's own health checks, every second): the router goes on
  sending new requests to the drained pod, whose engine hands each one back at once.

Without a continuation layer in front of the router, a handed-back stream ends at the
client with the engine's handed-back event: that is the most these tests ask of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devstack.local_stack import LocalStack, Pod, RoutedFleet
from devstack.routers import RouterLoad, SentStream
from tests.routers.stack import ROUTERS
from tests.support.processes import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("router_name", ROUTERS)]

PODS = 3
CLIENTS = 6
TOKENS = 30
AFTER_TOLD = 2 * CLIENTS
"""Streams sent after the router was told that must end before the load stops: enough that
round robin would have sent some of them to the drained pod."""
COORDINATOR = ["--grace-period", "6", "--safety-margin", "1", "--tier-timeout", "2",
               "--confirm-timeout", "1", "--prekill-timeout", "1", "--scan-interval", "0.5"]
"""A 5 s budget: 2 s of migration (nothing acknowledges a handed-back request here, so the
phase lasts its whole window), 3 s for the ordered kill."""
HEALTH_CHECK_S = 1
"""The router's own health check of each engine (both default to 60 s)."""
WAIT_S = 60.0


async def _until(predicate: Callable[[], Any], what: str) -> Any:
    """``wait_for`` off the event loop, which keeps the clients reading."""
    return await asyncio.to_thread(wait_for, predicate, timeout=WAIT_S, what=what)


def _in_flight_on(pod: Pod) -> bool:
    return any(r["how"] is None for r in pod.requests())


def _router_told(pod: Pod) -> dict[str, Any] | None:
    """The coordinator's ``routers`` entry once its removal answered; fails on a failure."""
    entry: dict[str, Any] = httpx.get(f"{pod.coordinator.url}/status", timeout=5).json()[
        "routers"][0]
    if entry["state"] == "failed":
        raise AssertionError(f"the router call failed: {entry}")
    return entry if entry["state"] == "removed" else None


def _told_and_more_sent(fleet: RoutedFleet, load: RouterLoad) -> dict[str, Any] | None:
    """The drained pod's ``routers`` entry once the router was told and ``AFTER_TOLD``
    streams sent after that have ended."""
    told = _router_told(fleet.pods[0])
    after = [s for s in load.ended() if told and s.sent_at > told["at"]]
    return told if len(after) >= AFTER_TOLD else None


def _check_streams(sent: list[SentStream]) -> None:
    """Nothing lost: every stream ended [DONE] with exactly its tokens, or handed back after
    exactly its first tokens (as many as the handed-back event says)."""
    errors = [(s.request_id, s.error) for s in sent if s.end == "error"]
    assert not errors, errors
    assert all(s.exact for s in sent if s.end == "done"), \
        [s.request_id for s in sent if s.end == "done" and not s.exact]
    assert all(s.exact_prefix for s in sent if s.end == "handed_back"), \
        [(s.request_id, s.tokens, s.handed_back) for s in sent
         if s.end == "handed_back" and not s.exact_prefix]


def _handed_back_by(pod: Pod) -> set[str]:
    return {r["request_id"] for r in pod.requests() if r["how"] == "handed_back"}


async def _drained_under_load(
    stack: LocalStack, router_name: str, *, adapter: bool,
    until: Callable[[RoutedFleet, RouterLoad], Any], proxy: bool = False,
) -> tuple[RoutedFleet, list[SentStream], dict[str, Any], Any]:
    """Steps 1-5 of every scenario (with ``proxy``, the load goes through the continuation
    proxy, told every coordinator); returns the fleet, the streams, the drain's summary and
    what ``until`` returned."""
    fleet = await asyncio.to_thread(
        stack.start_routed_pods, router_name, PODS, adapter=adapter,
        coordinator_args=COORDINATOR, health_check_interval_s=HEALTH_CHECK_S)
    drained = fleet.pods[0]
    url = fleet.router.url
    if proxy:
        url = await asyncio.to_thread(stack.start_continuation_proxy, url,
                                      [p.coordinator.url for p in fleet.pods])
    load = RouterLoad(url, clients=CLIENTS, max_tokens=TOKENS, prefix=router_name)
    clients = asyncio.create_task(load.run())
    try:
        await _until(lambda: all(p.requests() for p in fleet.pods) and _in_flight_on(drained),
                     "every engine taking requests, one in flight on the drained pod")
        drain = asyncio.create_task(asyncio.to_thread(
            httpx.get, f"{drained.coordinator.url}/drain", timeout=WAIT_S))
        seen = await _until(lambda: until(fleet, load), "the scenario's event")
        answer = await drain
    finally:
        load.stop()
        sent = await clients
    assert answer.status_code == 200, answer.text
    return fleet, sent, answer.json(), seen


async def test_with_the_adapter_no_request_reaches_the_drained_pod_once_the_router_was_told(
    router_name: str, local_stack: LocalStack
) -> None:
    """1. Three pods behind the router, each coordinator with ``--router`` (the adapter).
    2. Six clients stream 30-token completions back to back through the router, until
       every engine has taken some and one is in flight on pod 0.
    3. ``GET /drain`` on pod 0's coordinator (the preStop hook's call).
    4. Wait until its ``/status`` ``routers`` entry says the removal answered (its ``at``:
       the router was told), then until twelve streams sent after that have ended.
    5. The drain answers; the load stops.
    6. Nothing lost: every stream whole, or handed back after exactly its first tokens.
    7. Pod 0's engine took no request sent after the router was told (its own log); the
       twelve and more went to the other engines, whole.
    8. The handed-back streams are exactly those pod 0's engine logged handing back, all
       taken before the router was told; the coordinator's summary counts them as its
       unacknowledged handoffs (no continuation layer here), its timeline has the drain
       start before the router's answer, and every process of the pod exited."""

    fleet, sent, summary, told = await _drained_under_load(
        local_stack, router_name, adapter=True, until=_told_and_more_sent)
    drained, others = fleet.pods[0], fleet.pods[1:]
    _check_streams(sent)

    sent_at = {s.request_id: s.sent_at for s in sent}
    late = [r for r in drained.requests() if sent_at[r["request_id"]] > told["at"]]
    assert not late, ("sent after the router was told, taken by the drained engine (ms after "
                      "it was told): " + ", ".join(
                          f"{r['request_id']} +{(r['arrived_at'] - told['at']) * 1000:.0f}"
                          for r in late))
    after = {s.request_id for s in sent if s.sent_at > told["at"]}
    served_by_others = {r["request_id"] for p in others for r in p.requests()}
    assert len(after) >= AFTER_TOLD
    assert after <= served_by_others, after - served_by_others
    assert all(s.exact for s in sent if s.request_id in after)

    handed = {s.request_id for s in sent if s.end == "handed_back"}
    assert handed, "the drain handed nothing back: no stream was in flight on pod 0"
    assert handed == _handed_back_by(drained)
    assert all(sent_at[rid] < told["at"] for rid in handed)
    assert summary["drain"]["lost_requests"] == len(handed), summary["drain"]
    entry = summary["routers"][0]
    assert (entry["kind"], entry["action"], entry["error"]) == (router_name, "remove", None)
    draining_at = next(t["at"] for t in summary["timeline"] if t["phase"] == "draining")
    assert draining_at <= told["at"]
    assert {p["fate"] for p in summary["processes"]} == {"exited"}, summary["processes"]


async def test_without_the_adapter_the_router_sends_new_requests_to_the_drained_pod(
    router_name: str, local_stack: LocalStack
) -> None:
    """The baseline: the router sees only its own health checks (every second).

    1. Three pods behind the router, the coordinators without ``--router``.
    2. Six clients stream through the router, until every engine has taken some and one
       is in flight on pod 0.
    3. ``GET /drain`` on pod 0's coordinator.
    4. Wait until pod 0's engine has taken a request sent after the drain started (from its
       own log; the engine's ``/health`` still answers 200, so the router keeps choosing it).
    5. The drain answers; the load stops.
    6. Every stream that ended [DONE] is whole; every handed-back one is exactly its first
       tokens, and pod 0's engine logged handing back each one.
    7. The requests sent after the drain started that reached pod 0 were handed back; those
       it took once it had learned of the drain (its end record says when), before their
       first token: without a continuation layer their clients got nothing. The
       coordinator's summary has no router entry, and counts every hand-back as
       unacknowledged."""

    def sent_after_the_drain_reached_it(fleet: RoutedFleet, load: RouterLoad) -> list[str]:
        drained = fleet.pods[0]
        status = httpx.get(f"{drained.coordinator.url}/status", timeout=5).json()
        started = (status["drain"] or status.get("last_drain") or {}).get("started_at")
        sent_at = {s.request_id: s.sent_at for s in load.sent}
        return [r["request_id"] for r in drained.requests()
                if started is not None and sent_at[r["request_id"]] > started]

    fleet, sent, summary, late = await _drained_under_load(
        local_stack, router_name, adapter=False, until=sent_after_the_drain_reached_it)
    drained = fleet.pods[0]
    assert all(s.exact for s in sent if s.end == "done")
    assert all(s.exact_prefix for s in sent if s.end == "handed_back")
    handed = {s.request_id for s in sent if s.end == "handed_back"}
    assert handed == _handed_back_by(drained)

    taken = {r["request_id"]: r for r in drained.requests()}
    started = summary["drain"]["started_at"]
    assert late
    assert all(taken[rid]["arrived_at"] > started for rid in late)
    assert set(late) <= handed
    # Once the engine had learned of the drain (its worker client's shutdown_event, from its
    # own end record), every request it took was handed back before its first token.
    record = drained.engine.record_of(drained.engine.pid) or {}
    learned = record["worker_client"]["shutdown_event_set_at"]
    after_learning = [r for r in taken.values() if r["arrived_at"] > learned]
    assert after_learning, taken
    assert all((r["how"], r["tokens"]) == ("handed_back", 0) for r in after_learning)
    assert summary["routers"] == []
    assert summary["drain"]["lost_requests"] == len(handed), summary["drain"]


def _client_of(prompt: str, sent: list[SentStream]) -> SentStream | None:
    """The client request a prompt the engine took belongs to: its own, or a continuation's
    (the client's prompt and the text already streamed)."""
    return next((s for s in sent if prompt.startswith(s.prompt)), None)


async def test_through_the_continuation_proxy_every_stream_arrives_whole(
    router_name: str, local_stack: LocalStack
) -> None:
    """1. Three pods behind the router with the adapter, and the continuation proxy in front
       of the router, acknowledging handoffs to the three coordinators.
    2. Six clients stream through the proxy, until every engine has taken some and one is in
       flight on pod 0.
    3. ``GET /drain`` on pod 0's coordinator; wait until the router was told and twelve
       streams sent after that have ended; the drain answers; the load stops.
    4. Zero lost, zero duplicated or missing tokens: every stream ended [DONE] with exactly
       the engine's tokens for its prompt.
    5. Pod 0's engine handed streams back (its own log), and each of those clients got its
       stream whole; every request pod 0 took (by its prompt) was sent before the router
       was told.
    6. The proxy acknowledged every handoff: the drain is graceful, nothing lost."""
    fleet, sent, summary, told = await _drained_under_load(
        local_stack, router_name, adapter=True, until=_told_and_more_sent, proxy=True)
    drained = fleet.pods[0]
    broken = [(s.request_id, s.end, s.error, len(s.tokens)) for s in sent if not s.exact]
    assert not broken, broken
    taken = [(r, _client_of(r["prompt"], sent)) for r in drained.requests()]
    assert all(client is not None for _, client in taken), taken
    handed = [client for r, client in taken if r["how"] == "handed_back"]
    assert handed, "the drain handed nothing back: no stream was in flight on pod 0"
    assert all(client is not None and client.exact for client in handed)
    late = [r["prompt"] for r, client in taken if client and client.sent_at > told["at"]]
    assert not late, late
    assert summary["outcome"] == "graceful", summary.get("drain")
    assert summary["drain"]["lost_requests"] == 0
