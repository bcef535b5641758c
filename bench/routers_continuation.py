"""Requests lost and tokens duplicated while a pod drains behind a real router, with the
continuation proxy in front of the router and without it.

Pods behind the router, each coordinator with the router adapter (no new request reaches a
draining pod); a closed-loop load of 40-token streams; the pods drained one at a time, each
to its end, by the preStop hook's call (``GET /drain``). Without the proxy, a stream the
drained engine hands back ends at the client with the handed-back event: that request is
lost and its remaining tokens missing. With the proxy (``python -m continuation_proxy``
acknowledging handoffs to every coordinator), each one is continued through the router on
another pod. Every stream that was open at any moment of a drain is counted, against the
tokens the engines produce for its prompt (``expected_tokens``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.routers_rig import COORDINATOR, HEALTH_CHECK_S, WAIT_S, until
from devstack.local_stack import LocalStack, Pod
from devstack.routers import RouterLoad, SentStream

TOKENS = 40
"""Tokens per stream, 20 ms apart (the engine's default): 0.8 s, so a drain always finds
streams in flight."""
SIDES = ("without", "with")
"""Without the continuation proxy, and with it."""


@dataclass
class Damage:
    router: str
    side: str
    drains: int
    streams: int
    """Streams open at some moment of a drain (sent before it answered, ended after it
    started)."""
    lost: int
    """Of those, the ones that did not end [DONE] with exactly their tokens."""
    missing: int
    duplicated: int
    """Tokens expected and never received; received beyond the expected ones (as multisets,
    so a repeated token counts even when the stream's length is right)."""
    handed_back: int
    """Requests the drained engines handed back (their own logs)."""
    outcomes: Counter[str]
    """The drains' outcomes (``graceful``; ``lost_requests`` when no one acknowledged a
    handoff)."""


def token_damage(stream: SentStream) -> tuple[int, int]:
    """(missing, duplicated) tokens of one stream against its expected tokens."""
    have, need = Counter(stream.tokens), Counter(stream.expected())
    return sum((need - have).values()), sum((have - need).values())


async def measure_damage(kind: str, with_proxy: bool, drains: int, clients: int,
                         workdir: Path) -> Damage:
    """1. ``drains + 2`` pods behind ``kind``, adapters on (each rep drains one pod to its
       end; two are left to serve), and with ``with_proxy`` the proxy in front, told every
       coordinator.
    2. The load through the proxy, or straight through the router.
    3. Per drain: wait until the pod has a stream in flight (its engine's log), ``GET
       /drain`` on its coordinator, then wait until every stream sent before the drain
       answered has ended; count the streams that were open during the drain.
    4. Stop the load; end every process."""
    stack = LocalStack(workdir)
    damage = Damage(kind, SIDES[with_proxy], 0, 0, 0, 0, 0, 0, Counter())
    try:
        fleet = await asyncio.to_thread(
            stack.start_routed_pods, kind, drains + 2, coordinator_args=COORDINATOR,
            health_check_interval_s=HEALTH_CHECK_S)
        url = fleet.router.url
        if with_proxy:
            url = await asyncio.to_thread(stack.start_continuation_proxy, url,
                                          [p.coordinator.url for p in fleet.pods])
        load = RouterLoad(url, clients=clients, max_tokens=TOKENS, prefix=f"{kind}-{with_proxy}")
        running = asyncio.create_task(load.run())
        try:
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                for pod in fleet.pods[:drains]:
                    await _drain_one(http, pod, load, damage)
        finally:
            load.stop()
            await running
    finally:
        await stack.close()
    return damage


async def _drain_one(http: httpx.AsyncClient, pod: Pod, load: RouterLoad,
                     damage: Damage) -> None:
    await until(lambda: any(r["how"] is None for r in pod.requests()),
                f"a stream in flight on {pod.name}")
    started = time.time()
    answer = await http.get(f"{pod.coordinator.url}/drain")
    answered = time.time()
    answer.raise_for_status()
    open_then = [s for s in load.sent if s.sent_at <= answered]
    await until(lambda: all(s.ended_at is not None for s in open_then),
                "the drain's streams ended")
    during = [s for s in open_then if s.ended_at is not None and s.ended_at >= started]
    damage.drains += 1
    damage.streams += len(during)
    damage.lost += sum(1 for s in during if not s.exact)
    for stream in during:
        missing, duplicated = token_damage(stream)
        damage.missing += missing
        damage.duplicated += duplicated
    damage.handed_back += sum(1 for r in pod.requests() if r["how"] == "handed_back")
    damage.outcomes[str(answer.json().get("outcome"))] += 1


def damage_table(results: list[Damage]) -> list[str]:
    """Side by side (Markdown)."""
    lines = ["| router | continuation proxy | drains | streams open during a drain | lost "
             "| tokens missing | tokens duplicated | handed back | drain outcomes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for d in results:
        outcomes = ", ".join(f"{n} {word}" for word, n in sorted(d.outcomes.items()))
        lines.append(f"| {d.router} | {d.side} | {d.drains} | {d.streams} | {d.lost} | "
                     f"{d.missing} | {d.duplicated} | {d.handed_back} | {outcomes} |")
    return lines
