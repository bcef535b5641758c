"""The chaos soak's scenario kinds (``bench/soak.py``): one drain of one pod each.

Every kind starts with the pod's engine up and registered and the cycle's streaming load
flowing through the router, and returns the drain's summary (a ``GET /drain`` answer, or
the force drain's ``POST /drain`` answer). What a kind finds wrong on its own way (a refusal
that was not, an abort that touched the engine, joined drain calls that disagree) goes to
``cycle.errors``; the ground-truth checks common to every kind are ``bench/soak_truth.py``'s.

Kinds that must act while the drain is in ``migrating`` hold it there with a *probe*: one
streaming request sent straight to the engine, not through the router, so nobody but the
soak acknowledges its handoff; the drain stays in ``migrating`` until the soak acks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import soak_hostile
from bench.soak_rig import Fleet, SoakPod, status, wait_status
from bench.soak_truth import CRASH, FORCE, NORMAL, untouched
from devstack.sim.launcher import EngineHandle
from devstack.sim.linux import wait_for_exits
from devstack.sim.tokens import expected_tokens
from router_client import sse

DRAIN_TIMEOUT_S = 120.0
PROBE_TOKENS = 100_000
JOINED_CALLS = 4
WAIT_S = 30.0
ROUTER_EXITS = (0, -signal.SIGTERM)
"""How the reference router may end after SIGTERM, once every stream it carried ended."""


@dataclass
class Cycle:
    """One drain of one pod."""

    fleet: Fleet
    pod: SoakPod
    engine: EngineHandle
    number: int
    http: httpx.AsyncClient
    """Sends the coordinators' token."""
    errors: list[str] = field(default_factory=list)
    main_code: int | None = None
    """The engine main process's wait status, when the kind itself waited for it."""
    router_stats: list[dict[str, Any]] = field(default_factory=list)
    """``/stats`` of a router the kind stopped."""
    extra: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    """Processes of the soak's own the kind registered with the coordinator: the drain must
    end them too, and its summary list them."""

    @property
    def url(self) -> str:
        return self.pod.coordinator.url


@dataclass(frozen=True)
class Kind:
    name: str
    run: Callable[[Cycle], Awaitable[dict[str, Any]]]
    about: str
    knobs: dict[str, Any] = field(default_factory=dict)
    """Engine knobs the drained engine is started with."""
    outcome: str = "graceful"
    """The outcome a drain of this kind calls for."""
    exclusive: bool = False
    """No other pod drains meanwhile: the router restarts, and no load may start while it is
    down."""
    mode: str = NORMAL
    restart_pod_only: bool = False
    """Runs on the pod whose coordinator is not counted as long-lived."""

    @property
    def may_lose(self) -> bool:
        """Requests may be lost by design (nothing hands them back first)."""
        return self.mode != NORMAL


# --- helpers --------------------------------------------------------------------------------


async def drain_get(c: Cycle) -> dict[str, Any]:
    """``GET /drain`` as the kubelet's preStop hook sends it; the summary."""
    response = await c.http.get(f"{c.url}/drain", timeout=DRAIN_TIMEOUT_S)
    return _summary(response, "GET /drain")


def _summary(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code != 200:
        raise SoakStepError(f"{what}: {response.status_code} {response.text[:300]}")
    summary: dict[str, Any] = response.json()
    return summary


class SoakStepError(RuntimeError):
    """A step of a kind did not go as the contract says."""


async def start_drain(c: Cycle, reason: str) -> dict[str, Any]:
    """``POST /drain {"wait": false}``: 202 at once."""
    response = await c.http.post(f"{c.url}/drain", json={"wait": False, "reason": reason})
    if response.status_code != 202:
        raise SoakStepError(f"POST /drain: {response.status_code} {response.text[:300]}")
    answer: dict[str, Any] = response.json()
    return answer


async def ack(c: Cycle, *request_ids: str) -> None:
    response = await c.http.post(f"{c.url}/migrations/ack",
                                 json={"request_ids": list(request_ids)})
    if response.status_code != 200:
        raise SoakStepError(f"ack: {response.status_code} {response.text[:300]}")


async def wait_handed_back(c: Cycle, request_id: str) -> dict[str, Any]:
    """Until the coordinator lists ``request_id`` as handed back (the drain is migrating)."""
    def listed(document: dict[str, Any]) -> bool:
        return any(m["request_id"] == request_id for m in document.get("migrations") or ())
    return await wait_status(c.http, c.url, listed, f"the handoff of {request_id}")


class Probe:
    """A streaming request straight to the engine; its handoff waits for the soak's ack."""

    def __init__(self, c: Cycle) -> None:
        self.request_id = f"soak-probe-{c.pod.name}-{c.number}"
        self.url = c.engine.url
        self.first_token = asyncio.Event()
        self.handed_back = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        body = {"prompt": f"probe {self.request_id}", "max_tokens": PROBE_TOKENS,
                "stream": True}
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None)) as http, \
                http.stream("POST", f"{self.url}/v1/completions", json=body,
                            headers={"X-Request-Id": self.request_id}) as response:
            async for event in sse.events(response.aiter_lines()):
                if isinstance(event, dict) and event.get("handed_back"):
                    self.handed_back = True
                    return
                self.first_token.set()

    @contextlib.asynccontextmanager
    async def streaming(self) -> AsyncIterator[Probe]:
        """Open the stream, wait for its first token, close it at the end."""
        self._task = asyncio.create_task(self._run())
        try:
            waiter = asyncio.create_task(self.first_token.wait())
            done, _ = await asyncio.wait({waiter, self._task}, timeout=WAIT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                waiter.cancel()
                raise SoakStepError(f"probe {self.request_id}: no first token")
            yield self
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task


async def engine_serves(c: Cycle) -> None:
    """A short request straight to the engine completes with the expected tokens (it may be
    handed back until the engine has heard of the abort: then again)."""
    prompt = f"after the abort {c.number}"
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        for _ in range(200):
            tokens: list[str] = []
            async with http.stream("POST", f"{c.engine.url}/v1/completions",
                                   json={"prompt": prompt, "max_tokens": 3, "stream": True},
                                   ) as response:
                async for event in sse.events(response.aiter_lines()):
                    if event == sse.DONE:
                        if tokens != expected_tokens(prompt, 3):
                            raise SoakStepError(f"after the abort: tokens {tokens}")
                        return
                    if not isinstance(event, dict) or event.get("handed_back"):
                        break
                    tokens.append(sse.chunk_text(event))
            await asyncio.sleep(0.05)
    raise SoakStepError("after the abort the engine still hands every request back")


async def metric(c: Cycle, name: str) -> float:
    text = (await c.http.get(f"{c.url}/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


# --- the kinds ------------------------------------------------------------------------------


async def graceful(c: Cycle) -> dict[str, Any]:
    return await drain_get(c)


async def abort(c: Cycle) -> dict[str, Any]:
    """Abort in ``migrating``: serving again, the engine untouched; then a graceful drain."""
    async with Probe(c).streaming() as probe:
        await start_drain(c, "soak: to be aborted")
        await wait_handed_back(c, probe.request_id)
        response = await c.http.delete(f"{c.url}/drain")
        if response.status_code != 200:
            raise SoakStepError(f"DELETE /drain: {response.status_code} {response.text[:300]}")
        document = await status(c.http, c.url)
        if document["phase"] != "serving":
            c.errors.append(f"after the abort the phase is {document['phase']}")
        states = [w["state"] for w in document["workers"] if w["pid"] == c.engine.pid]
        if states != ["serving"]:
            c.errors.append(f"after the abort the worker is {states}")
        c.errors += [f"abort touched the engine: {w}"
                     for w in untouched(c.engine, c.pod.start_ticks)]
        await ack(c, probe.request_id)
    await engine_serves(c)
    return await drain_get(c)


async def force(c: Cycle) -> dict[str, Any]:
    response = await c.http.post(f"{c.url}/drain", json={"force": True, "reason": "soak"},
                                 timeout=DRAIN_TIMEOUT_S)
    return _summary(response, "POST /drain force")


async def crash(c: Cycle) -> dict[str, Any]:
    """SIGKILL the engine's main process while the drain is in ``migrating``."""
    async with Probe(c).streaming() as probe:
        await start_drain(c, "soak: the engine crashes")
        await wait_handed_back(c, probe.request_id)
        os.kill(c.engine.pid, signal.SIGKILL)
        c.main_code = await asyncio.to_thread(c.engine.proc.wait, WAIT_S)
        # Its children die of PDEATHSIG; the drain goes on once they are all gone.
        await asyncio.to_thread(wait_for_exits, list(c.pod.start_ticks), WAIT_S)
        await ack(c, probe.request_id)
    return await drain_get(c)


async def coordinator_restart(c: Cycle) -> dict[str, Any]:
    """SIGKILL the coordinator in ``migrating``, start it again on its state file: it
    resumes the same drain and finishes it."""
    async with Probe(c).streaming() as probe:
        started = (await start_drain(c, "soak: coordinator restart"))["drain"]["started_at"]
        await wait_handed_back(c, probe.request_id)
        await asyncio.to_thread(wait_saved, c.pod.state_file, probe.request_id)
        old = c.pod.coordinator.proc
        old.send_signal(signal.SIGKILL)
        await asyncio.to_thread(old.wait, WAIT_S)
        await asyncio.to_thread(c.fleet.restart_coordinator, c.pod)
        document = await status(c.http, c.url)
        if (document.get("drain") or {}).get("started_at") != started:
            c.errors.append(f"the restarted coordinator's drain is {document.get('drain')}")
        if not any(t.get("note") == "resumed" for t in document.get("timeline") or ()):
            c.errors.append("the restarted coordinator did not say it resumed the drain")
        await ack(c, probe.request_id)
    summary = await drain_get(c)
    if summary["drain"]["started_at"] != started:
        c.errors.append("the summary is of another drain than the one resumed")
    return summary


def wait_saved(state_file: Path, request_id: str) -> None:
    """Until the state file holds the drain in ``migrating`` with ``request_id`` pending."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            document = json.loads(state_file.read_text())
            pending = (document.get("migrations") or {}).get("pending") or ()
            if document.get("phase") == "migrating" and any(
                    m.get("request_id") == request_id for m in pending):
                return
        time.sleep(0.02)
    raise SoakStepError(f"{state_file} never held the migrating drain")


async def router_restart(c: Cycle) -> dict[str, Any]:
    """SIGTERM the router while the drain is in ``migrating`` (it ends once the streams it
    carries have), start it again on the same port: it learns the pod is draining."""
    async with Probe(c).streaming() as probe:
        await start_drain(c, "soak: router restart")
        await wait_handed_back(c, probe.request_id)
        with contextlib.suppress(httpx.HTTPError):
            c.router_stats.append((await c.http.get(f"{c.fleet.router_url}/stats")).json())
        code = await asyncio.to_thread(c.fleet.stop_router)
        if code not in ROUTER_EXITS:  # uvicorn raises the signal again once it has stopped
            c.errors.append(f"the router exited with {code} on SIGTERM")
        await asyncio.to_thread(c.fleet.start_router)
        await router_sees_draining(c)
        await ack(c, probe.request_id)
    return await drain_get(c)


async def router_sees_draining(c: Cycle) -> None:
    for _ in range(int(WAIT_S / 0.05)):
        workers = (await c.http.get(f"{c.fleet.router_url}/workers")).json()
        if any(w["url"] == c.engine.url and w["draining"] for w in workers):
            return
        await asyncio.sleep(0.05)
    c.errors.append("the restarted router never saw the pod draining")


async def concurrent(c: Cycle) -> dict[str, Any]:
    """Several ``GET /drain`` at once join one drain and all get the same summary."""
    started = await metric(c, "shutdown_coordinator_drains_started_total")
    async with Probe(c).streaming() as probe:
        calls = [asyncio.create_task(c.http.get(f"{c.url}/drain", timeout=DRAIN_TIMEOUT_S))
                 for _ in range(JOINED_CALLS)]
        await wait_handed_back(c, probe.request_id)
        await ack(c, probe.request_id)
        answers = [_summary(r, "joined GET /drain") for r in await asyncio.gather(*calls)]
    views = {json.dumps(_gist(a), sort_keys=True) for a in answers}
    if len(views) != 1:
        c.errors.append(f"{JOINED_CALLS} joined drain calls got {len(views)} summaries")
    drains = await metric(c, "shutdown_coordinator_drains_started_total") - started
    if drains != 1:
        c.errors.append(f"{JOINED_CALLS} drain calls started {drains:g} drains")
    return answers[0]


def _gist(summary: dict[str, Any]) -> dict[str, Any]:
    return {"started_at": summary["drain"]["started_at"], "outcome": summary.get("outcome"),
            "processes": sorted((p["pid"], p["fate"], p["exit_code"])
                                for p in summary["processes"])}


async def hostile(c: Cycle) -> dict[str, Any]:
    """Hostile requests in ``migrating``: each refused (4xx) or harmless, the drain goes on.
    A process of the soak's registers with the tier pattern ``(a+)+$`` (its command line
    the pattern's catastrophic input): the drain's kill matches it, and must end it too."""
    sacrifice = await asyncio.to_thread(start_sacrifice, c)
    async with Probe(c).streaming() as probe:
        await start_drain(c, "soak: hostile requests")
        before = await wait_handed_back(c, probe.request_id)
        worker = next(w["id"] for w in before["workers"] if w["pid"] == c.engine.pid)
        requests = soak_hostile.battery(c.engine.pid, worker, c.fleet.headers)
        c.errors += await soak_hostile.send(c.url, requests)
        after = await status(c.http, c.url)
        if after["phase"] != "migrating":
            c.errors.append(f"after the hostile requests the phase is {after['phase']}")
        if sorted(w["id"] for w in after["workers"]) != sorted(w["id"] for w in
                                                               before["workers"]):
            c.errors.append(f"hostile requests changed the workers: {after['workers']}")
        answer = await c.http.post(f"{c.url}/workers", content=soak_hostile.register_sacrifice(
            sacrifice.pid), headers=soak_hostile.JSON)
        if answer.status_code == 201:
            c.extra[sacrifice.pid] = sacrifice
        elif 400 <= answer.status_code < 500:
            sacrifice.terminate()
            await asyncio.to_thread(sacrifice.wait, WAIT_S)
        else:
            c.errors.append(f"registering with (a+)+$: {answer.status_code} {answer.text[:200]}")
            c.extra[sacrifice.pid] = sacrifice
        await ack(c, probe.request_id, soak_hostile.HOSTILE_ID)
    return await drain_get(c)


def start_sacrifice(c: Cycle) -> subprocess.Popen[bytes]:
    ready = c.fleet.workdir / f"sacrifice-{c.number}.up"
    proc = c.fleet.stack.spawn([sys.executable, "-c", soak_hostile.SACRIFICE, str(ready),
                                soak_hostile.SACRIFICE_TAIL], f"{c.pod.name}-sacrifice.log")
    deadline = time.monotonic() + WAIT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SoakStepError(f"the sacrifice process did not start ({proc.poll()})")
        time.sleep(0.02)
    ready.unlink()
    return proc


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("graceful", graceful, "GET /drain, as the kubelet's preStop hook"),
    Kind("abort", abort, "POST /drain wait=false, DELETE /drain in migrating (the engine "
         "must be untouched and serve), then GET /drain"),
    Kind("force", force, "POST /drain force=true", outcome="killed", mode=FORCE),
    Kind("crash", crash, "SIGKILL of the engine's main process in migrating",
         outcome="signalled", mode=CRASH),
    Kind("coordinator_restart", coordinator_restart, "SIGKILL of the coordinator in "
         "migrating, restarted on its state file", restart_pod_only=True),
    Kind("router_restart", router_restart, "the router SIGTERMed and restarted in migrating",
         exclusive=True),
    Kind("stubborn_child", graceful, "GET /drain; scheduler 0 ignores SIGTERM",
         outcome="killed", knobs={"ignore_sigterm": ("scheduler:0",)}),
    Kind("daemon_child", graceful, "GET /drain; the detokenizer daemonized a process "
         "(double fork, setsid)", knobs={"daemonize": ("detokenizer",)}),
    Kind("concurrent", concurrent, f"{JOINED_CALLS} GET /drain at once"),
    Kind("hostile", hostile, "hostile requests in migrating, then GET /drain"),
)}
