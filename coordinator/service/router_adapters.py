"""Routers told through their own API that this pod's engine drains, and that it serves again.

smg and vllm-router are Rust binaries: they cannot run a watcher of ours, but both have a
worker API. The coordinator knows a drain's first millisecond, so it calls them
(docs/routers.md has what each call was seen to do):

    router        drain started                                 drain aborted, or joining
    smg           GET /workers (the id, by URL), PATCH its       GET /workers; once the worker
                  settle time, DELETE /workers/{id}: draining    left, POST /workers {"url"}
    vllm-router   POST /remove_worker?url=…                      POST /add_worker?url=…
    reference     nothing: it watches this coordinator's /status

Joining (``--router-join``, on by default): when the coordinator starts and no drain is being
resumed, it waits for the engine's ``GET /health`` to answer 200 (a model loads for minutes;
asked again within ``LOADING_MAX_WAIT_S``), then adds the engine to every router as an
abort's restore does. That is how a pod that replaced a drained one in a rolling update gets
its traffic from a router that does not discover pods itself; one that does (smg's
``--service-discovery``) answers "already listed".

Every call:

    1. runs in a task of its own: the drain never waits for it (``drain_started`` returns at
       once), and a call still running when the drain is aborted is cancelled for the
       restore;
    2. is bounded: ``CALL_BUDGET_S`` in all, never past the drain's migration deadline, each
       attempt at most ``ATTEMPT_TIMEOUT_S``;
    3. is retried with backoff (tenacity) while the failure may pass (not reachable, a 5xx,
       smg still settling the worker's removal), not when the router refuses it (a 4xx);
    4. ends in one state per router in ``/status`` ``routers``, one count in
       ``shutdown_coordinator_router_calls_total{router,action,result}`` and one log line;
       "already gone" (removing a worker the router no longer lists, adding one it lists) is
       success.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from coordinator.router_settings import RouterSpec
from coordinator.tls import verify_for

if TYPE_CHECKING:
    import httpx

    from coordinator.service.metrics import CoordinatorMetrics

log = logging.getLogger(__name__)

CALL_BUDGET_S = 3.0
"""One removal or restore, every attempt and wait included. Taking a worker out answers in a
few milliseconds on both routers; 3 s rides out a router restarting or a busy node, and is
small against a drain's migration window (cut to it when that is shorter)."""
RESTORE_BUDGET_S = 30.0
"""One restore after an abort, every attempt and wait included. No drain waits on it, and smg
adds a worker back only once its removal has settled (``SMG_SETTLE_S``, then smg's own removal
pass, seconds on a busy node): a budget of ``CALL_BUDGET_S`` would give up on a restore that a
few more seconds complete, leaving a serving engine out of the router."""
JOIN_BUDGET_S = 1800.0
"""Joining at start, waiting for the engine's health included: as long as the manifests'
engine startupProbe allows a model to load (5 s x 360). No drain waits on it; a drain cancels
it."""
JOIN_MAX_WAIT_S = 2.0
"""Backoff cap of a join's calls to a router that fails (restarting, overloaded): asked
again every 2 s at most, from every pod that joins it."""
LOADING_MAX_WAIT_S = 0.25
"""Backoff cap while the engine is not healthy yet (``EngineLoading``): its ``/health``, on
the pod's own network, is asked 4 times a second once the backoff reaches it, so the engine
joins its routers at most 0.25 s after it first answers 200 (a cap of 2 s let a loaded
engine wait up to 2 s for its traffic, once per pod in a rolling update). A loading engine
pays a refused connection, or a 503, each time."""
ATTEMPT_TIMEOUT_S = 1.0
"""One attempt of a removal at most (the drain waits on it)."""
ADD_ATTEMPT_TIMEOUT_S = 10.0
"""One attempt of a join or a restore at most, the engine's health check before it included:
vllm-router's ``add_worker`` checks the worker's ``/health`` first, and SGLang's ``/health``
runs a one-token generation (1.1 s measured on a loaded node, where 1 s attempts never
joined). No drain waits on these."""
FIRST_WAIT_S = 0.02
MAX_WAIT_S = 0.5
"""Backoff between attempts: 20 ms doubling up to 500 ms."""
SMG_SETTLE_S = 1
"""smg's ``drain_settle_secs`` set on the worker before its removal (smg's default is 5 s):
the worker is ``draining`` at once either way, open streams end whole either way (verified),
and smg refuses to add the worker back until it left, so a shorter settle makes an abort
restore it sooner."""


class Retryable(Exception):
    """A failure that may pass: not reachable, a timeout, a 5xx, a worker still settling."""


class EngineLoading(Retryable):
    """The engine does not answer its ``/health`` with 200 yet: a join asks again soon
    (``LOADING_MAX_WAIT_S``)."""


class Refused(Exception):
    """The router refused the call (a 4xx other than the ones that mean "already done")."""


# --- the retry policy: pure, tested without sleeping -----------------------------------------

def call_deadline(now: float, now_wall: float, migration_deadline_at: float | None,
                  budget_s: float = CALL_BUDGET_S) -> float:
    """The monotonic time a call must end by: ``budget_s`` from ``now``, never past the
    drain's migration deadline (``migration_deadline_at``, epoch seconds; None: no drain)."""
    if migration_deadline_at is None:
        return now + budget_s
    return now + max(0.0, min(budget_s, migration_deadline_at - now_wall))


class stop_at_deadline(stop_base):
    """Stop when the next attempt would start at or after ``deadline`` (``clock``'s time)."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline = deadline
        self.clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.clock() + (retry_state.upcoming_sleep or 0.0) >= self.deadline


class wait_by_cause(wait_base):
    """Backoff from ``FIRST_WAIT_S``, doubling: up to ``LOADING_MAX_WAIT_S`` after the
    engine was not healthy yet, up to ``max_wait_s`` after any other failure."""

    def __init__(self, max_wait_s: float) -> None:
        self.other = wait_exponential(multiplier=FIRST_WAIT_S, min=FIRST_WAIT_S,
                                      max=max_wait_s)
        self.loading = wait_exponential(multiplier=FIRST_WAIT_S, min=FIRST_WAIT_S,
                                        max=LOADING_MAX_WAIT_S)

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        loading = outcome is not None and isinstance(outcome.exception(), EngineLoading)
        return (self.loading if loading else self.other)(retry_state)


def retrying(deadline: float, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
             max_wait_s: float = MAX_WAIT_S) -> AsyncRetrying:
    """Attempts until one succeeds, the router refuses, or the deadline (``wait_by_cause``
    between them); the last failure is raised as it was."""
    return AsyncRetrying(
        stop=stop_at_deadline(deadline, clock), wait=wait_by_cause(max_wait_s),
        retry=retry_if_exception_type(Retryable), sleep=sleep, reraise=True)


# --- what each router is asked ---------------------------------------------------------------

class Adapter(Protocol):
    """One attempt of each action; returns a few words on what the router now does."""

    async def remove(self, http: httpx.AsyncClient, attempt_s: float) -> str: ...

    async def restore(self, http: httpx.AsyncClient, attempt_s: float) -> str: ...


def check(response: httpx.Response) -> None:
    """A 2xx passes; a 5xx or 429 may pass on a later attempt; any other answer is refused."""
    if response.is_success:
        return
    text = f"answered {response.status_code}: {response.text[:200]}"
    if response.status_code >= 500 or response.status_code == 429:
        raise Retryable(text)
    raise Refused(text)


@dataclass
class SmgAdapter:
    """SGLang Model Gateway: its worker API, by id, found by URL (the id changes with every
    registration)."""

    url: str
    worker_url: str
    headers: dict[str, str]

    async def _listed(self, http: httpx.AsyncClient, attempt_s: float) -> dict[str, Any] | None:
        response = await http.get(f"{self.url}/workers", headers=self.headers, timeout=attempt_s)
        check(response)
        for worker in response.json().get("workers", []):
            if str(worker.get("url", "")).rstrip("/") == self.worker_url:
                return dict(worker)
        return None

    async def remove(self, http: httpx.AsyncClient, attempt_s: float) -> str:
        worker = await self._listed(http, attempt_s)
        if worker is None:
            return "not listed (already gone)"
        if worker.get("status") == "draining":
            return "draining"
        path = f"{self.url}/workers/{worker['id']}"
        for method, body in (("PATCH", {"health": {"drain_settle_secs": SMG_SETTLE_S}}),
                             ("DELETE", None)):
            response = await http.request(method, path, json=body, headers=self.headers,
                                          timeout=attempt_s)
            if response.status_code == 404:  # removed since it was listed
                return "not listed (already gone)"
            check(response)
        return f"draining, removed after {SMG_SETTLE_S}s"

    async def restore(self, http: httpx.AsyncClient, attempt_s: float) -> str:
        worker = await self._listed(http, attempt_s)
        if worker is not None:
            if worker.get("status") == "draining":
                raise Retryable("still draining: smg adds it back once it left")
            return f"listed ({worker.get('status')})"
        response = await http.post(f"{self.url}/workers", json={"url": self.worker_url},
                                   headers=self.headers, timeout=attempt_s)
        if response.status_code == 409:
            if "IN_PROGRESS" in response.text:
                return "being added"
            raise Retryable(f"answered 409: {response.text[:200]}")
        check(response)
        return "added back"


@dataclass
class VllmRouterAdapter:
    """vllm-router: workers added and removed by URL."""

    url: str
    worker_url: str

    async def remove(self, http: httpx.AsyncClient, attempt_s: float) -> str:
        check(await http.post(f"{self.url}/remove_worker", params={"url": self.worker_url},
                              timeout=attempt_s))
        return "removed"

    async def restore(self, http: httpx.AsyncClient, attempt_s: float) -> str:
        response = await http.post(f"{self.url}/add_worker", params={"url": self.worker_url},
                                   timeout=attempt_s)
        if response.status_code == 400 and "already exists" in response.text:
            return "listed (already there)"
        check(response)
        return "added back"


# --- the adapters of one coordinator ---------------------------------------------------------

@dataclass
class RouterState:
    """What ``/status`` ``routers`` shows of one router."""

    kind: str
    url: str
    state: str = "idle"
    """``idle`` (nothing asked yet), ``joining``, ``joined``, ``removing``, ``removed``,
    ``restoring``, ``restored``, ``failed`` (``action`` says which), or ``watching`` (the
    reference router: no call)."""
    action: str | None = None
    attempts: int = 0
    error: str | None = None
    note: str | None = None
    at: float | None = None
    """Epoch seconds of the last change."""
    took_ms: float | None = None

    def to_status(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "state": self.state, "action": self.action,
                "attempts": self.attempts, "error": self.error, "note": self.note,
                "at": self.at, "took_ms": self.took_ms}


WATCHING_NOTE = "nothing to call: it learns of the drain from this coordinator's /status"
_DONE = {"remove": "removed", "restore": "restored", "join": "joined"}
_RUNNING = {"remove": "removing", "restore": "restoring", "join": "joining"}
_BUDGET_S = {"remove": CALL_BUDGET_S, "restore": RESTORE_BUDGET_S, "join": JOIN_BUDGET_S}


class RouterAdapters:
    """Every router of one coordinator, each called in a task of its own."""

    def __init__(self, specs: list[RouterSpec], worker_url: str | None, token: str | None,
                 metrics: CoordinatorMetrics, on_change: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.states = [RouterState(spec.kind, spec.url) for spec in specs]
        self.adapters: list[Adapter | None] = []
        self.worker_url = worker_url
        for spec in specs:
            if spec.kind == "reference" or worker_url is None:
                self.adapters.append(None)
            elif spec.kind == "smg":
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                self.adapters.append(SmgAdapter(spec.url, worker_url, headers))
            else:
                self.adapters.append(VllmRouterAdapter(spec.url, worker_url))
        self.metrics = metrics
        self._on_change = on_change
        self._clock = clock
        self._sleep = sleep
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._http: httpx.AsyncClient | None = None
        if any(a is not None for a in self.adapters):
            # Imported and built here, before any drain: the first call pays no set-up.
            import httpx

            self._http = httpx.AsyncClient(
                timeout=ATTEMPT_TIMEOUT_S,
                verify=verify_for(worker_url, *(spec.url for spec in specs)))

    def drain_started(self, migration_deadline_at: float) -> None:
        """Take the worker out of every router (returns at once; step 1)."""
        self._launch_safely("remove", migration_deadline_at)

    def drain_aborted(self) -> None:
        """Put the worker back in every router (returns at once)."""
        self._launch_safely("restore", None)

    def join(self) -> None:
        """Add the worker to every router once the engine is healthy (returns at once; a
        drain that starts meanwhile cancels it)."""
        if any(a is not None for a in self.adapters):
            self._launch_safely("join", None)

    def _launch_safely(self, action: str, migration_deadline_at: float | None) -> None:
        try:
            self._launch(action, migration_deadline_at)
        except Exception:  # never into the drain
            log.exception("the routers could not be told (%s); the drain goes on", action)

    def to_status(self) -> list[dict[str, Any]]:
        return [s.to_status() for s in self.states]

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    def _launch(self, action: str, migration_deadline_at: float | None) -> None:
        deadline = call_deadline(self._clock(), time.time(), migration_deadline_at,
                                 _BUDGET_S[action])
        for i, adapter in enumerate(self.adapters):
            state = self.states[i]
            if adapter is None:
                state.state, state.action, state.note = "watching", action, WATCHING_NOTE
                state.at = time.time()
                self.metrics.router_calls.labels(state.kind, action, "not_needed").inc()
                continue
            running = self._tasks.pop(i, None)
            if running is not None:
                running.cancel()  # the restore follows whatever the removal got to
            self._tasks[i] = asyncio.get_running_loop().create_task(
                self._call(i, adapter, action, deadline), name=f"router-{action}-{i}")
        self._on_change()

    async def _call(self, i: int, adapter: Adapter, action: str, deadline: float) -> None:
        state = self.states[i]
        state.state, state.action, state.attempts = _RUNNING[action], action, 0
        state.error = state.note = state.took_ms = None
        state.at = time.time()
        started = self._clock()
        assert self._http is not None
        http = self._http
        try:
            if deadline <= started:
                raise Retryable("no time left before the drain's migration deadline")
            max_wait = JOIN_MAX_WAIT_S if action == "join" else MAX_WAIT_S
            async with asyncio.timeout(deadline - started):
                async for attempt in retrying(deadline, self._clock, self._sleep, max_wait):
                    with attempt:
                        state.attempts += 1
                        cap = ATTEMPT_TIMEOUT_S if action == "remove" else ADD_ATTEMPT_TIMEOUT_S
                        attempt_s = max(0.001, min(cap, deadline - self._clock()))
                        note = await self._attempt(adapter, action, http, attempt_s)
            self._ended(state, _DONE[action], started, note=note)
        except asyncio.CancelledError:
            # The next call (an abort's restore) owns the state from now on, or we stop.
            self.metrics.router_calls.labels(state.kind, action, "cancelled").inc()
            log.info("router %s %s: %s cancelled after %d attempt(s)",
                     state.kind, state.url, action, state.attempts)
            raise
        except TimeoutError:
            self._ended(state, "failed", started,
                        error=f"no answer within {deadline - started:.3g}s")
        except (Retryable, Refused) as exc:
            self._ended(state, "failed", started, error=str(exc))
        except Exception as exc:  # never into the drain
            self._ended(state, "failed", started, error=f"{exc.__class__.__name__}: {exc}")
        finally:
            if self._tasks.get(i) is asyncio.current_task():
                del self._tasks[i]

    async def _attempt(self, adapter: Adapter, action: str, http: httpx.AsyncClient,
                       attempt_s: float) -> str:
        import httpx

        try:
            if action == "remove":
                return await adapter.remove(http, attempt_s)
            if action == "join":
                await self._engine_healthy(http, attempt_s)
            return await adapter.restore(http, attempt_s)
        except httpx.TransportError as exc:
            raise Retryable(f"not reachable ({exc.__class__.__name__}: {exc})") from exc
        except ValueError as exc:  # a body that is not the JSON expected
            raise Refused(f"answered nonsense ({exc})") from exc

    async def _engine_healthy(self, http: httpx.AsyncClient, attempt_s: float) -> None:
        """A router told of an engine still loading would probe it, fail, and (smg) mark it
        failed: join only once the engine's own health check passes."""
        import httpx

        try:
            response = await http.get(f"{self.worker_url}/health", timeout=attempt_s)
        except httpx.TransportError as exc:
            raise EngineLoading(f"the engine does not answer yet ({self.worker_url}/health: "
                                f"{exc.__class__.__name__}: {exc})") from exc
        if response.status_code != 200:
            raise EngineLoading(f"the engine is not healthy yet ({self.worker_url}/health "
                                f"answered {response.status_code})")

    def _ended(self, state: RouterState, result: str, started: float, *,
               note: str | None = None, error: str | None = None) -> None:
        action = state.action or "?"
        took = max(0.0, self._clock() - started)
        state.state = result
        state.note, state.error, state.at = note, error, time.time()
        state.took_ms = round(took * 1000, 1)
        self.metrics.router_calls.labels(state.kind, action,
                                         "ok" if result in _DONE.values() else result).inc()
        self.metrics.router_call_seconds.labels(state.kind, action).observe(took)
        attempts = f"{state.attempts} attempt{'s' if state.attempts != 1 else ''}"
        if result in _DONE.values():
            log.info("router %s %s: %s in %.1f ms (%s): %s", state.kind, state.url, action,
                     took * 1000, attempts, note)
        else:
            log.warning("router %s %s: %s failed after %s in %.1f ms: %s; the drain goes on",
                        state.kind, state.url, action, attempts, took * 1000, error)
        self._on_change()
