"""The HTTP API (FastAPI): the contract of DESIGN.md and the engine protocol of
docs/architecture.md. Handlers stay thin; ``Coordinator`` holds the state.

Errors are JSON with a ``detail`` and a 4xx status: validation → 422, missing or wrong token →
401, a refused PID → 403, an unknown worker → 404, a request that does not fit the drain's
phase → 409.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from coordinator import __version__
from coordinator.drain.budget import remaining
from coordinator.drain.handover import so_far
from coordinator.drain.phases import Phase
from coordinator.drain.ports import Killer
from coordinator.errors import (
    DrainConflict,
    LimitReached,
    RefusedCaller,
    RefusedTarget,
    TargetNotFound,
)
from coordinator.service import reach
from coordinator.service.auth import TokenCheck
from coordinator.service.events import EventStream
from coordinator.service.fast_status import (
    StatusFastPath,
    limit_body,
    limit_headers,
    long_poll,
)
from coordinator.service.invalid_input import invalid_input
from coordinator.service.metrics import CONTENT_TYPE
from coordinator.service.models import AckRequest, DrainRequest, RegisterRequest, ReportRequest
from coordinator.service.openapi_doc import AT_THE_DOOR, GUARDED, document, limited
from coordinator.service.plan import kill_plan
from coordinator.service.posture import Posture
from coordinator.service.registry import Worker
from coordinator.service.request_guard import RequestGuard
from coordinator.service.runtime import Coordinator
from coordinator.service.timeline_view import running_drain, timeline_document
from coordinator.settings import Settings

JSON = "application/json"
WAIT_SLACK_S = 1.0
"""A blocking drain call waits this much past the budget for the final transition."""

WorkerId = Annotated[str, Path(min_length=1, max_length=64)]



async def disconnected(request: Request) -> None:
    """Returns once the client of ``request`` (a body-less call) has gone away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def default_kill() -> Killer:
    """The kill engine: one kill at a time, joined by later calls."""
    from coordinator.kill import Terminator

    return Terminator()


def create_app(settings: Settings, *, kill: Killer | None = None,
               checked: Posture | None = None) -> FastAPI:
    """Build the app around a fresh ``Coordinator`` (``checked``: the posture ``serve``
    already found for ``settings``)."""
    coordinator = Coordinator(settings, kill or default_kill(), checked)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await coordinator.start()
        try:
            yield
        finally:
            await coordinator.stop()

    # No /docs or /redoc (they load their scripts from a CDN a pod does not reach), and the
    # schema is served behind the token like everything that is not a probe.
    app = FastAPI(title="shutdown-coordinator", version=__version__, lifespan=lifespan,
                  openapi_url=None, docs_url=None, redoc_url=None)
    app.state.coordinator = coordinator
    coordinator.metrics.drain_clock.source = lambda: running_drain(coordinator)
    # The token is checked once, by the request guard, before any body is read.
    check = TokenCheck(coordinator.token)
    public = APIRouter(responses=AT_THE_DOOR)
    api = APIRouter(responses=GUARDED)

    def problem(status: int, detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        return invalid_input(exc.errors())

    @app.exception_handler(RefusedTarget)
    async def _refused(_request: Request, exc: RefusedTarget) -> JSONResponse:
        return problem(403, str(exc))

    @app.exception_handler(RefusedCaller)
    async def _refused_caller(_request: Request, exc: RefusedCaller) -> JSONResponse:
        return problem(403, str(exc))

    @app.exception_handler(TargetNotFound)
    async def _not_found(_request: Request, exc: TargetNotFound) -> JSONResponse:
        return problem(422, str(exc))

    @app.exception_handler(DrainConflict)
    async def _conflict(_request: Request, exc: DrainConflict) -> JSONResponse:
        return problem(409, str(exc))

    @app.exception_handler(LimitReached)
    async def _limit(_request: Request, exc: LimitReached) -> Response:
        coordinator.metrics.limit_refusals.labels(exc.limit).inc()
        headers = {name.decode(): value.decode() for name, value in limit_headers(exc)}
        return Response(limit_body(exc), status_code=429, media_type=JSON, headers=headers)

    def worker_or_404(worker_id: str) -> Worker:
        worker = coordinator.registry.workers.get(worker_id)
        if worker is None:
            raise unknown_worker(worker_id)
        return worker

    def caller(request: Request) -> reach.Caller:
        return reach.identify(request.scope, coordinator.posture)

    def reached_worker(request: Request, worker_id: str, what: str) -> Worker:
        """The worker, once the caller is found to reach it (``reach``)."""
        worker = worker_or_404(worker_id)
        reach.check_worker(caller(request), worker, what)
        return worker

    async def check_drain(request: Request, what: str) -> None:
        """Without the token, only a caller that could signal every process the drain would
        signal may start, join, force or abort it: checked against a scan made now."""
        who = caller(request)
        if who.trusted:
            return
        await coordinator.rescan()
        reach.check_drain(who, reach.drain_processes(coordinator), what)

    # --- probes and metrics ----------------------------------------------------------------

    @public.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness: the coordinator's loop answers."""
        return {"status": "ok", "phase": coordinator.machine.phase.value}

    @public.get("/readyz", responses={503: {"description": "a drain has started"}})
    async def readyz() -> JSONResponse:
        """Readiness of the engine: 200 while serving, 503 from the first moment of a drain."""
        phase = coordinator.machine.phase
        if phase is Phase.SERVING:
            return JSONResponse({"ready": True, "phase": phase.value})
        return JSONResponse({"ready": False, "phase": phase.value,
                             "detail": f"the pod is {phase.value}"}, status_code=503)

    @public.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text exposition."""
        return Response(coordinator.metrics.render(), media_type=CONTENT_TYPE)

    # --- the drain -------------------------------------------------------------------------

    async def start_and_maybe_wait(reason: str, deadline_s: float | None,
                                   wait: bool, force: bool = False) -> Response:
        drain, joined = coordinator.controller.start(reason, deadline_s, force=force)
        if not wait:
            return JSONResponse(
                {"phase": coordinator.machine.phase.value,
                 "generation": coordinator.machine.generation,
                 "joined": joined, "drain": drain.to_status()},
                status_code=202)
        timeout = remaining(drain.deadlines.deadline_at, coordinator.controller.clock())
        finished = await coordinator.controller.wait(timeout + WAIT_SLACK_S)
        if finished and coordinator.group is not None:
            # The group's summary: every follower's report, within the group's budget.
            await coordinator.group.wait_settled(drain, coordinator.changes,
                                                 coordinator.controller.clock)
        if finished:
            _, etag, body = coordinator.view.status_bytes()
            return Response(body, media_type=JSON, headers={"ETag": etag})
        document = coordinator.view.status_document()
        document["outcome"] = "timeout"
        return JSONResponse(document)

    async def start_and_hand_over(request: Request) -> Response:
        """Start or join the drain; answer when the kill reaches the main processes and
        leaves their signal to this caller (``coordinator.drain.handover``), or at the end
        of a drain that never does (no main process left, aborted, all SIGKILLed)."""
        controller = coordinator.controller
        drain, _ = controller.start("preStop", None)
        handed = controller.handover.wait()
        coordinator.bump()  # /status shows the caller waiting
        timeout = remaining(drain.deadlines.deadline_at, controller.clock())
        ended = asyncio.ensure_future(controller.wait(timeout + WAIT_SLACK_S))
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait((handed, ended, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ended, gone):
                task.cancel()
            if not handed.done():
                controller.handover.forget(handed)  # step 3: takes nothing over
                coordinator.bump()
        if handed.done() and not handed.cancelled():
            document = coordinator.view.status_document()
            document["main_left_to_caller"] = handed.result()
            verdict = so_far(drain.outcomes.values(), force=drain.force)
            document["outcome_so_far"] = verdict.outcome
            document["causes_so_far"] = list(verdict.causes)
            return JSONResponse(document)
        if ended.done() and not ended.cancelled() and ended.result():
            _, etag, body = coordinator.view.status_bytes()
            return Response(body, media_type=JSON, headers={"ETag": etag})
        document = coordinator.view.status_document()
        if not gone.done():
            document["outcome"] = "timeout"
        return JSONResponse(document)

    @api.get("/drain")
    async def drain_get(request: Request, main: Annotated[Literal["caller"] | None, Query(
            description="``caller``: answer when the kill reaches the main processes (the "
                        "kill targets' roots) and leave their graceful signal to the caller "
                        "(an exec preStop hook: the kubelet's SIGTERM follows its return); "
                        "``main_left_to_caller`` lists them. What outlives its tier is "
                        "SIGKILLed as usual.")] = None) -> Response:
        """Start or join the drain and block until done (kubelet ``preStop`` ``httpGet``),
        or until the main processes are next (``main=caller``)."""
        await check_drain(request, "start or join the drain")
        if main == "caller":
            return await start_and_hand_over(request)
        return await start_and_maybe_wait("preStop", None, True)

    @api.post("/drain", status_code=200, responses={202: {"description": "started"}})
    async def drain_post(request: Request,
                         body: Annotated[DrainRequest | None, Body()] = None) -> Response:
        """Start or join the drain; ``wait=false`` answers 202 at once. ``force`` skips
        migration and SIGKILLs every process; joining a running drain it escalates it."""
        asked = body or DrainRequest()
        await check_drain(request, "force the drain" if asked.force else
                          "start or join the drain")
        return await start_and_maybe_wait(asked.reason, asked.deadline_s, asked.wait,
                                          asked.force)

    @api.delete("/drain", responses={409: {"description": "too late to abort"}})
    async def drain_delete(request: Request) -> dict[str, Any]:
        """Abort a drain that has not reached ``terminating``; end the cycle of a done drain
        that found nothing to drain (``aborted`` false, ``cycle_ended`` true); 409 once
        processes were terminated."""
        await check_drain(request, "abort the drain")
        aborted = coordinator.abort_drain()
        return {"phase": coordinator.machine.phase.value, "aborted": aborted,
                "cycle_ended": not aborted, "generation": coordinator.machine.generation}

    # --- status ----------------------------------------------------------------------------

    @api.get("/status", response_class=Response, responses={
        304: {"description": "unchanged"}, **limited("max_long_polls")})
    async def status(
        request: Request,
        wait: Annotated[float, Query(ge=0, le=86_400)] = 0.0,
        since: Annotated[int | None, Query(ge=0, le=2**53)] = None,
        view: Literal["full", "router"] = "full",
    ) -> Response:
        """The whole state; ``?wait=S&since=G`` blocks until ``generation`` > G (S capped);
        ``view=router`` leaves out ``processes`` and the history (what routers poll).

        Well-formed requests are answered by ``StatusFastPath`` before reaching this route;
        it stays as the documented, validating fallback with the same behaviour.
        """
        await long_poll(coordinator, wait, since, settings.long_poll_cap_s)
        _, etag, body = coordinator.view.status_bytes(view)
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        return Response(body, media_type=JSON, headers={"ETag": etag,
                                                        "Cache-Control": "no-cache"})

    @api.get("/status/timeline", response_class=Response, responses={
        200: {"content": {"text/html": {}, "image/svg+xml": {}},
              "description": "the drain's timeline"}})
    async def status_timeline(
        drain: Annotated[Literal["current", "last"], Query(
            description="``current``: the running or just finished drain (the last one "
                        "while serving); ``last``: ``last_drain``, the drain before")] =
            "current",
        format: Annotated[Literal["html", "svg"], Query(
            description="``html``: one self-contained page; ``svg``: the drawing "
                        "alone")] = "html",
    ) -> Response:
        """The drain drawn: phases as bands, a row per process (per tier past a few
        hundred), marks at its graceful signal, SIGKILL and exit, handoffs over time."""
        # Imported here: the drawing code serves this page alone, asked for after a drain.
        from coordinator.timeline import CSP, render_html, render_svg

        document = timeline_document(coordinator, drain)
        headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                   "Content-Security-Policy": CSP}
        if format == "svg":
            svg_text = await asyncio.to_thread(render_svg, document)
            return Response(svg_text, media_type="image/svg+xml", headers=headers)
        page = await asyncio.to_thread(render_html, document)
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    @api.get("/plan")
    async def plan() -> dict[str, Any]:
        """The kill as it would run now: its tiers in order, each with its signal, timeout and
        the processes the last scan listed in it."""
        return kill_plan(coordinator)

    # --- workers ---------------------------------------------------------------------------

    @api.post("/workers", status_code=201, responses={
        200: {"description": "already registered"}, 403: {"description": "refused pid"},
        409: {"description": "the drain is terminating"}, 422: {"description": "bad input"},
        **limited("max_workers")})
    async def register(body: RegisterRequest, request: Request) -> JSONResponse:
        """Register a worker process (identity checked); same process again → same id.
        Without a token, only a caller that could signal the process itself may."""
        who = caller(request)
        uids = reach.check_registration(who, body.pid, coordinator.posture)
        worker, created = coordinator.register(
            body, uids=uids, reach_uid=None if who.trusted else who.uid)
        return JSONResponse(
            {"id": worker.id, "pid": worker.pid, "start_time": worker.start_time,
             "events_url": f"/workers/{worker.id}/events",
             "phase": coordinator.machine.phase.value,
             "generation": coordinator.machine.generation},
            status_code=201 if created else 200)

    @api.delete("/workers/{worker_id}", responses={404: {"description": "unknown worker"}})
    async def deregister(request: Request, worker_id: WorkerId) -> dict[str, str]:
        """Forget a worker (it will not be part of the kill)."""
        reached_worker(request, worker_id, "deregister")
        if coordinator.deregister(worker_id) is None:
            raise unknown_worker(worker_id)
        return {"id": worker_id, "state": "deregistered"}

    @api.get("/workers/{worker_id}/events", response_class=Response,
             responses={404: {"description": "unknown worker"},
                        **limited("max_streams_per_worker")})
    async def events(request: Request, worker_id: WorkerId) -> Response:
        """NDJSON stream: ``hello``, then ``drain``, ``abort``, ``terminate``, ``ping``."""
        worker = reached_worker(request, worker_id, "open an event stream of")
        open_now = coordinator.notifier.connected(worker_id)
        if open_now >= settings.max_streams_per_worker:
            raise LimitReached("max_streams_per_worker",
                               f"worker {worker_id} holds {open_now} event streams open, the "
                               "limit (--max-streams-per-worker)")
        return EventStream(coordinator, worker)

    @api.post("/workers/{worker_id}/report", responses={
        404: {"description": "unknown worker"}, **limited("max_handoffs")})
    async def report(request: Request, worker_id: WorkerId,
                     body: ReportRequest) -> dict[str, int]:
        """In-flight count, handed-back requests, ``prekill_done``."""
        worker = reached_worker(request, worker_id, "report for")
        first_notice = worker.notified_at is None and body.notified_at is not None
        coordinator.report(worker, body)
        drain = coordinator.controller.drain
        if first_notice and body.notified_at is not None and drain is not None and \
                coordinator.machine.phase is not Phase.SERVING:
            coordinator.metrics.shutdown_event_seconds.observe(
                max(body.notified_at - drain.deadlines.started_at, 0.0))
        return {"generation": coordinator.machine.generation}

    @api.post("/migrations/ack", responses=limited("max_early_acks"))
    async def ack(request: Request, body: AckRequest) -> dict[str, list[str]]:
        """A router re-issued these handed-back requests: ``acked`` were pending, ``early``
        were not reported yet (applied when they are), ``unknown`` were settled already.
        ``continued``: streams this drain ended (``--end-streams``) that a proxy took over,
        answered as ``continued`` (counted) and ``refused`` (no ending window open, more
        than were ended, or counted already)."""
        who = caller(request)
        reach.check_acks(who, coordinator.acked_workers(body.request_ids))
        if body.continued:
            reach.check_trusted(who, "count streams as taken over by a proxy")
        result = coordinator.ack(body.request_ids, owner=None if who.trusted else who.uid)
        answer = {"acked": result.acked, "early": result.early, "unknown": result.unknown}
        if body.continued:
            answer["continued"], answer["refused"] = coordinator.continued(body.continued)
        return answer

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi_schema() -> JSONResponse:
        """This API's OpenAPI document."""
        return JSONResponse(document(app))

    app.include_router(public)
    app.include_router(api)
    if coordinator.group is not None:
        # Imported here: only a pod in a group serves (and documents) these routes.
        from coordinator.service.group_routes import group_routes

        app.include_router(group_routes(coordinator, coordinator.group,
                                        settings.long_poll_cap_s, caller),
                           responses=GUARDED)
    app.add_middleware(StatusFastPath, coordinator=coordinator, cap_s=settings.long_poll_cap_s)
    # Added last, so it is the outermost: it sees every request first.
    app.add_middleware(RequestGuard, check=check, max_body_bytes=settings.max_body_bytes,
                       read_timeout_s=settings.read_timeout_s,
                       hosts=coordinator.posture.hosts())
    return app


def unknown_worker(worker_id: str) -> HTTPException:
    """The 404 for a worker id nobody registered (or already deregistered)."""
    return HTTPException(status_code=404, detail=f"unknown worker {worker_id!r}")
