"""Follow many coordinators' ``/status`` by long-poll, for a router.

One task per coordinator holds ``GET /status?wait=S&since=G`` open; the coordinator answers as
soon as its ``generation`` moves past ``G`` (a drain starts, a request is handed back), so the
router learns of a drain within one round trip, with no polling interval.

The router asks three things: is this worker draining (stop sending it work), was this request
handed back (continue it elsewhere), and acknowledge the handoffs it re-issued. An
acknowledgement often reaches the coordinator before the worker's handoff report does (the
router reads the handed-back event from the stream first); the coordinator answers it
``early``, remembers it and applies it when the report lands. A coordinator that answers
``unknown`` instead (one without early acknowledgements) gets the ack again as soon as the
request shows up in ``migrations``; acking twice is harmless either way. So does a coordinator
that lists a request this router already acknowledged: it forgot the acknowledgement (it was
restarted before it saved it), and without a second one would count the request lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

import shutdown_wire as wire
from router_client.errors import MalformedAnswer
from router_client.messages import AckResult, Migration, RouterStatus

log = logging.getLogger("router_client")

LONG_POLL_S = 20.0
"""How long the coordinator may hold one ``/status`` long-poll (s); below common idle timeouts."""
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
ACKED_KEPT = 10_000
"""Request ids acknowledged to one coordinator that are remembered (the newest), so one listed
again after that coordinator's restart is acknowledged again."""
ACK_WINDOW_S = 0.005
"""Acks to one coordinator are gathered this long (s) and sent as one call: a draining pod
hands back its requests within a few ms, and one ack call per request would load the
coordinator (and the router) at the very moment the drain's push is still reaching workers."""


@dataclass
class CoordinatorView:
    """The last ``/status`` seen from one coordinator."""

    url: str
    status: RouterStatus | None = None
    """The last answer; None until the first one."""
    generation: int = -1
    reachable: bool = False
    updated_at: float = 0.0
    """time.monotonic() of the last answer."""
    pending_acks: set[str] = field(default_factory=set)
    """Acks the coordinator did not know yet (the handoff report was still on its way)."""
    acked: dict[str, None] = field(default_factory=dict)
    """Ids the coordinator took (``acked`` or ``early``), oldest first, at most
    ``ACKED_KEPT``."""

    def took(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.acked.pop(request_id, None)
            self.acked[request_id] = None
        while len(self.acked) > ACKED_KEPT:
            del self.acked[next(iter(self.acked))]

    @property
    def phase(self) -> str | None:
        return None if self.status is None else self.status.phase

    @property
    def draining(self) -> bool:
        return self.status is not None and self.status.draining

    def migrations(self) -> tuple[Migration, ...]:
        return () if self.status is None else self.status.migrations


class Watcher:
    """Watches coordinators; ``workers`` maps each worker URL to its coordinator's URL."""

    def __init__(
        self,
        workers: Mapping[str, str],
        *,
        token: str | None = None,
        long_poll_s: float = LONG_POLL_S,
        http: httpx.AsyncClient | None = None,
        max_connections: int | None = None,
    ) -> None:
        """``max_connections``: to the coordinators in all (default: four per coordinator
        named here, and eight more); set it when coordinators come and go (``follow``)."""
        self.workers = {_norm(w): _norm(c) for w, c in workers.items()}
        self.views = {c: CoordinatorView(c) for c in dict.fromkeys(self.workers.values())}
        self.long_poll_s = long_poll_s
        self._http = http or httpx.AsyncClient(
            headers=wire.bearer_header_bytes(token),
            timeout=httpx.Timeout(5.0, read=long_poll_s + 10.0),
            limits=httpx.Limits(max_connections=max_connections or 4 * len(self.views) + 8),
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self._changed = asyncio.Condition()
        self._ack_batches: dict[str, list[tuple[list[str], asyncio.Future[list[str]]]]] = {}
        self._ack_flushes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Watcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start one long-poll task per coordinator (inside a running loop)."""
        self._running = True
        for view in self.views.values():
            self._start_following(view)

    def follow(self, coordinator: str) -> None:
        """Watch one more coordinator, known by URL only (no worker named: what it lists is
        found by request id, as ``handed_back`` and ``ack`` do); a no-op for one watched."""
        url = _norm(coordinator)
        if url not in self.views:
            self.views[url] = CoordinatorView(url)
            if self._running:
                self._start_following(self.views[url])

    async def forget(self, coordinator: str) -> None:
        """Stop watching a coordinator that no worker names (its pod is gone)."""
        url = _norm(coordinator)
        if url in self.workers.values() or url not in self.views:
            return
        del self.views[url]
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _start_following(self, view: CoordinatorView) -> None:
        if view.url not in self._tasks:
            self._tasks[view.url] = asyncio.create_task(self._follow(view),
                                                        name=f"watch {view.url}")

    async def close(self) -> None:
        self._running = False
        for task in [*self._tasks.values(), *self._ack_flushes]:
            task.cancel()
        for task in [*self._ack_flushes, *self._tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._http.aclose()

    # -- questions --------------------------------------------------------------------------

    def coordinator_of(self, worker_url: str) -> str | None:
        return self.workers.get(_norm(worker_url))

    def is_draining(self, worker_url: str) -> bool:
        """True when the worker is to get no new work: its coordinator left ``serving`` (the
        whole pod is draining), or the coordinator lists the worker and none of its entries at
        that URL takes work (it is ``draining``, ``drained``, ``terminating``, or its process
        ``exited``). False for a worker its coordinator does not list (one it adopted)."""
        coordinator = self.coordinator_of(worker_url)
        if coordinator is None:
            return False
        view = self.views[coordinator]
        if view.status is None:
            return False
        if view.status.draining:
            return True
        entries = view.status.workers_at(worker_url)
        return bool(entries) and not any(entry.takes_work for entry in entries)

    def handed_back(self, request_id: str) -> Migration | None:
        """The pending migration of ``request_id`` on any coordinator, or None."""
        for view in self.views.values():
            if view.status is not None and (found := view.status.migration(request_id)):
                return found
        return None

    def pending_migrations(self) -> list[Migration]:
        """Every handed-back request not yet acknowledged, on every coordinator."""
        return [m for view in self.views.values() for m in view.migrations()]

    async def wait_for(self, predicate: Callable[[], bool], within_s: float) -> bool:
        """Wait until ``predicate()`` is true after some ``/status`` change (False after
        ``within_s`` seconds)."""
        deadline = time.monotonic() + within_s
        async with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
        return True

    def open_endings(self) -> list[str]:
        """The coordinators whose drain ended its engine's streams and takes ``continued``
        acknowledgements now (``stream_ending.open``)."""
        return [url for url, view in self.views.items()
                if view.status is not None and view.status.stream_ending is not None
                and view.status.stream_ending.open]

    async def ack_continued(self, coordinator: str, request_ids: list[str]) -> list[str]:
        """Tell ``coordinator`` that these streams its drain ended were taken over; returns
        those it counted (none when the call failed: the coordinator then counts them cut,
        which undercounts and never claims a stream that was not taken over)."""
        try:
            resp = await self._http.post(f"{_norm(coordinator)}/migrations/ack",
                                         json={"request_ids": [], "continued": request_ids})
            resp.raise_for_status()
            return list(AckResult.from_json(resp.json()).continued)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("telling %s of continued streams failed: %s", coordinator, exc)
            return []

    # -- acknowledgements -------------------------------------------------------------------

    async def ack(self, request_ids: Iterable[str], coordinator: str | None = None) -> list[str]:
        """Acknowledge re-issued requests; returns those the coordinator took (acknowledged,
        or remembered until their handoff is reported); the rest are retried.

        Without ``coordinator``, each id goes to every coordinator that lists it (or, when none
        does yet, to all of them on their next change).
        """
        ids = list(request_ids)
        if not ids:
            return []
        targets = [_norm(coordinator)] if coordinator else list(self.views)
        acked: list[str] = []
        for url in targets:
            view = self.views.get(url)
            if view is None:
                continue
            acked += await self._ack(view, ids)
        return acked

    async def _ack(self, view: CoordinatorView, ids: list[str]) -> list[str]:
        """Join the coordinator's next ack call (sent ``ACK_WINDOW_S`` after its first id)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[str]] = loop.create_future()
        batch = self._ack_batches.setdefault(view.url, [])
        batch.append((ids, fut))
        if len(batch) == 1:
            loop.call_later(ACK_WINDOW_S, self._start_flush, view)
        return await fut

    def _start_flush(self, view: CoordinatorView) -> None:
        task = asyncio.get_running_loop().create_task(self._flush_acks(view))
        self._ack_flushes.add(task)
        task.add_done_callback(self._ack_flushes.discard)

    async def _flush_acks(self, view: CoordinatorView) -> None:
        batch = self._ack_batches.pop(view.url, [])
        ids = list(dict.fromkeys(i for wanted, _ in batch for i in wanted))
        try:
            done = set(await self._post_ack(view, ids))
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        for wanted, fut in batch:
            if not fut.done():
                fut.set_result([i for i in wanted if i in done])

    async def _post_ack(self, view: CoordinatorView, ids: list[str]) -> list[str]:
        try:
            resp = await self._http.post(f"{view.url}/migrations/ack", json={"request_ids": ids})
            resp.raise_for_status()
            answer = AckResult.from_json(resp.json())
        except (httpx.HTTPError, ValueError) as exc:  # MalformedAnswer is a ValueError
            log.warning("ack to %s failed (%s); retrying on its next change", view.url, exc)
            view.pending_acks.update(ids)
            return []
        done = list(answer.taken)
        view.pending_acks.update(answer.unknown)
        view.pending_acks.difference_update(done)
        view.took(done)
        return done

    # -- the long-poll ----------------------------------------------------------------------

    async def _follow(self, view: CoordinatorView) -> None:
        delay = RETRY_FIRST_S
        while True:
            # The router view leaves out the process list: a few KB per answer, not ~100 KB.
            params: dict[str, Any] = {"view": "router"}
            if view.status is not None:
                params.update(wait=self.long_poll_s, since=view.generation)
            try:
                resp = await self._http.get(f"{view.url}/status", params=params)
                resp.raise_for_status()
                status = RouterStatus.from_json(resp.json(), f"{view.url}/status")
            except MalformedAnswer as exc:
                log.warning("coordinator %s answered a malformed /status: %s", view.url, exc)
                view.reachable = False
                await asyncio.sleep(RETRY_MAX_S)
                continue
            except (httpx.HTTPError, ValueError) as exc:
                if view.reachable:
                    log.info("coordinator %s unreachable: %s", view.url, exc)
                view.reachable = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_FIRST_S
            view.reachable = True
            view.updated_at = time.monotonic()
            if status.generation != view.generation or view.status is None:
                view.status, view.generation = status, status.generation
                await self._after_change(view)

    async def _after_change(self, view: CoordinatorView) -> None:
        if view.pending_acks or view.acked:
            listed = {m.request_id for m in view.migrations()}
            # Pending: not known to it yet. Acked before: it forgot (restarted unsaved).
            due = [r for r in listed if r in view.pending_acks or r in view.acked]
            if due:
                await self._ack(view, due)
        async with self._changed:
            self._changed.notify_all()


def _norm(url: str) -> str:
    return url.rstrip("/")
