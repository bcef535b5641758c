"""One measured drain of a pod behind a real router: how long new requests kept reaching it.

Three ways the router learns that the pod drains (``STRATEGIES``):

- ``adapter``: the pod's coordinator takes its engine out of the router at the drain's start
  (``--router``), through the router's own API;
- ``health``: nothing tells the router; its own health check (``GET /health`` of the engine,
  every ``HEALTH_CHECK_S``) fails only once the engine stops listening, at the end of the
  drain (the simulated engine, like SGLang's, answers ``/health`` 200 while it drains);
- ``kubernetes``: the coordinator's ``/readyz`` turns 503 at the drain's start, the kubelet's
  readiness probe sees it, the pod's endpoint is updated, and a router following endpoints
  removes the worker: simulated by removing it through the router's API after
  ``EndpointDelay`` (below).

Measured from the engine's own request log (``Pod.requests()``) and the coordinator's drain
start (``/status`` ``drain.started_at``), both epoch seconds on one host: ``last_ms``, from
the drain's start to the last request the drained engine took (0 when it took none after
the start). Its resolution is the gap between two requests reaching that engine
(``rate``). Every rep of ``adapter`` and ``kubernetes`` ends with an abort (``DELETE
/drain``) and the worker back in the router; a rep of ``health`` drains the pod to its end
and replaces it with a new one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack.local_stack import LocalStack, Pod, RoutedFleet
from devstack.routers import RouterLoad
from devstack.sim.records import REQUEST_LOG_PREFIX

STRATEGIES = ("adapter", "health", "kubernetes")
HEALTH_CHECK_S = 1
"""The routers' own health check interval (both default to 60 s): short, so ``health`` is
the best a router's health check does."""
HEALTH_FAILURES = 1
"""Failed checks before a worker is out (both default to 3): the best case again."""
MIN_DRAIN_S = 4
"""``--min-drain``: how long every drain stays in ``draining``. A deployment whose router
does not watch the coordinator needs one for its endpoints to catch up (the project's
SGLang and vLLM overlays set 5 s); here it also keeps each drain abortable past the
simulated endpoint delay (at most 3 s)."""
COORDINATOR = ["--grace-period", "12", "--safety-margin", "1", "--min-drain", str(MIN_DRAIN_S),
               "--tier-timeout", "2", "--confirm-timeout", "1", "--prekill-timeout", "1",
               "--scan-interval", "0.5"]
"""An 11 s drain budget, 6.6 s of it migration. Nothing acknowledges a handed-back request
here, and without the adapter new requests keep arriving and being handed back, so the
migration lasts its whole window: the ``health`` figure is that window plus the engine's
stop (with the default 30 s grace period, 13 s)."""
ENGINE: dict[str, Any] = {"token_interval_ms": 0.0}
"""One-token requests with no pause, so as many as the machine serves reach each engine per
second (about 75 with three pods on 2 cores): the resolution of ``last_ms``."""
MAX_TOKENS = 1
STEADY = 20
"""Requests a pod takes after it is back before the next rep, so its rate is the steady
one."""
WAIT_S = 60.0
POLL_S = 0.02


@dataclass(frozen=True)
class EndpointDelay:
    """The simulated Kubernetes endpoint update, from ``/readyz`` failing to the router
    removing the worker.

    ``probe_period_s``: the engine container's readiness probe in this project's manifest
    (deploy/kubernetes/base/engine-deployment.yaml: ``/readyz``, ``periodSeconds: 2``,
    ``failureThreshold: 1``): the kubelet sees the 503 at its next probe, uniformly 0-2 s
    after the drain's start (the kubelet's default, ``periodSeconds: 10`` with
    ``failureThreshold: 3``, would be 20-30 s).

    ``propagation_s``: the pod's new readiness reaching whatever routes: kubelet status
    update, EndpointSlice controller (batch period 0 by default), watch delivery, and for a
    Service kube-proxy's ``--iptables-min-sync-period`` (1 s by default), the floor between
    two rule syncs. 1 s is that floor; a loaded control plane adds more."""

    probe_period_s: float = 2.0
    propagation_s: float = 1.0

    def draw(self, rng: random.Random) -> float:
        return rng.uniform(0.0, self.probe_period_s) + self.propagation_s


@dataclass
class Sample:
    router: str
    strategy: str
    last_ms: float
    """Drain start → the last request the drained engine took (0: none after the start)."""
    reached: int
    """Requests the drained engine took after the drain's start."""
    told_ms: float
    """Drain start → the router told: the adapter's call answered, the simulated endpoint
    removal answered, or (``health``) the drain over and the engine gone."""
    rate: float
    """Requests per second the drained engine took in the second before the drain."""
    errors: int = 0
    """Requests sent after the drain's start that ended in an error (an HTTP error status,
    a refused or cut connection) by the end of the rep."""


class Arrivals:
    """The arrivals one engine logged (epoch seconds, request id), read as the log grows."""

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir
        self.times: list[tuple[float, str]] = []
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[tuple[float, str]]:
        for path in self.record_dir.glob(f"{REQUEST_LOG_PREFIX}*.jsonl"):
            with path.open("rb") as log:
                log.seek(self._offsets.get(path, 0))
                chunk = log.read()
            whole = chunk[:chunk.rfind(b"\n") + 1]  # a line being written waits its turn
            self._offsets[path] = self._offsets.get(path, 0) + len(whole)
            for text in whole.splitlines():
                line = json.loads(text)
                if line["event"] == "arrived":
                    self.times.append((line["at"], line["request_id"]))
        return self.times

    def after(self, at: float) -> list[float]:
        return [t for t, _ in self.poll() if t > at]


async def until(predicate: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``predicate`` (a coroutine function or a plain one) on this loop, which keeps the
    load's clients reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(POLL_S)


@dataclass
class Bench:
    """One router with its pods, a load through it, and the pods' arrival logs."""

    stack: LocalStack
    fleet: RoutedFleet
    load: RouterLoad
    http: httpx.AsyncClient
    live: list[Pod]
    arrivals: dict[str, Arrivals] = field(default_factory=dict)
    replaced: int = 0

    def of(self, pod: Pod) -> Arrivals:
        return self.arrivals.setdefault(pod.name, Arrivals(pod.engine.record_dir))

    async def status(self, pod: Pod) -> dict[str, Any]:
        body: dict[str, Any] = (await self.http.get(f"{pod.coordinator.url}/status")).json()
        return body

    async def serving(self, pod: Pod, since: float) -> None:
        """Until the pod's engine takes requests at its steady rate again and its
        coordinator serves."""
        await until(lambda: len(self.of(pod).after(since)) >= STEADY,
                    f"{pod.name} taking requests")
        await until(lambda: self._phase_is(pod, "serving"), f"{pod.name} serving")

    async def _phase_is(self, pod: Pod, phase: str) -> bool:
        return bool((await self.status(pod))["phase"] == phase)

    def _ended_after(self, at: float, count: int) -> bool:
        ended = 0
        for stream in reversed(self.load.sent):
            if stream.sent_at <= at:
                break
            ended += stream.end is not None
        return ended >= count

    async def rep(self, strategy: str, pod: Pod, delay: float) -> Sample:
        """1. The rate the pod took requests at over the last second.
        2. Start the drain (``POST /drain``, or the hook's blocking ``GET /drain`` for
           ``health``); its start is the coordinator's ``drain.started_at``.
        3. Tell the router the strategy's way; note when it was told.
        4. Wait until twice the load's clients sent after that have ended.
        5. The last arrival on the pod after the drain's start.
        6. Abort and put the worker back, or (``health``) replace the pod."""
        now = time.time()
        rate = float(len([t for t, _ in self.of(pod).poll() if now - 1.0 < t <= now]))
        blocking: asyncio.Task[httpx.Response] | None = None
        if strategy == "health":
            blocking = asyncio.create_task(
                self.http.get(f"{pod.coordinator.url}/drain", timeout=WAIT_S))
        else:
            answer = await self.http.post(f"{pod.coordinator.url}/drain", json={"wait": False})
            answer.raise_for_status()
        drain = await until(lambda: self._drain_of(pod), "the drain's start")
        started = float(drain["started_at"])
        told = await self._tell(strategy, pod, started + delay, blocking)
        await until(lambda: self._ended_after(told, 2 * self.load.clients),
                    "streams sent after the router was told")
        late = self.of(pod).after(started)
        errors = sum(1 for s in self.load.sent if s.sent_at > started and s.end == "error")
        sample = Sample(self.fleet.kind, strategy, 1000 * (max(late) - started) if late else 0.0,
                        len(late), 1000 * (told - started), rate, errors)
        await self._recover(strategy, pod)
        return sample

    async def _drain_of(self, pod: Pod) -> dict[str, Any] | None:
        status = await self.status(pod)
        drain: dict[str, Any] | None = status.get("drain")
        return drain if drain and drain.get("started_at") else None

    async def _tell(self, strategy: str, pod: Pod, remove_at: float,
                    blocking: asyncio.Task[httpx.Response] | None) -> float:
        if strategy == "adapter":
            entry = await until(lambda: self._removed(pod), "the adapter's removal")
            return float(entry["at"])
        if strategy == "kubernetes":
            # The simulated endpoint update: the probe's phase and the propagation delay.
            await asyncio.sleep(max(0.0, remove_at - time.time()))
            await asyncio.to_thread(self.fleet.router.remove_worker, pod.engine.url)
            return time.time()
        assert blocking is not None
        (await blocking).raise_for_status()
        return time.time()

    async def _removed(self, pod: Pod) -> dict[str, Any] | None:
        entry: dict[str, Any] = (await self.status(pod))["routers"][0]
        if entry["state"] == "failed":
            raise RuntimeError(f"the adapter's call failed: {entry}")
        return entry if entry["state"] == "removed" else None

    async def _recover(self, strategy: str, pod: Pod) -> None:
        if strategy == "health":
            await asyncio.to_thread(self.fleet.router.remove_worker, pod.engine.url)
            self.replaced += 1
            new = await asyncio.to_thread(self.stack.add_routed_pod, self.fleet,
                                          f"new{self.replaced}")
            self.live[self.live.index(pod)] = new
            await self.serving(new, time.time())
            return
        (await self.http.delete(f"{pod.coordinator.url}/drain")).raise_for_status()
        if strategy == "kubernetes":  # the endpoint back once /readyz answers 200 again
            await asyncio.to_thread(self.fleet.router.add_worker, pod.engine.url)
        await until(lambda: self.fleet.router.routes_to(pod.engine.url), "the worker back")
        await self.serving(pod, time.time())
