"""A tiny round-robin router for the continuation tests, run as its own process:

    python -m tests.continuation.round_robin --worker URL [--worker URL ...] --ready-file F

Every request goes to the next worker in turn that takes work, its answer streamed back
unchanged (the handed-back event included, as smg and vllm-router pass it). A worker takes
work while its ``GET /health`` answers ``handing_back: false``: a router that was told of the
drain (the coordinator's router adapters do that for smg and vllm-router), and while it was
not removed through vllm-router's worker API (``POST /remove_worker?url=…``; ``/add_worker``
puts it back), which a coordinator's ``--router vllm-router=…`` adapter calls. With none left
it answers 503, as a router without workers does. It continues nothing itself: that is the
continuation proxy's job in front of it.
"""

from __future__ import annotations

import argparse
import itertools

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.continuation.serving import run

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def build_app(workers: list[str], http: httpx.AsyncClient) -> Starlette:
    turn = itertools.cycle(range(len(workers)))
    served = dict.fromkeys(workers, 0)
    removed: set[str] = set()

    async def takes_work(worker: str) -> bool:
        if worker in removed:
            return False
        try:
            health = (await http.get(f"{worker}/health")).json()
        except (httpx.HTTPError, ValueError):
            return False
        return health.get("handing_back") is False

    async def pick() -> str | None:
        start = next(turn)
        for offset in range(len(workers)):
            worker = workers[(start + offset) % len(workers)]
            if await takes_work(worker):
                return worker
        return None

    async def route(request: Request) -> Response:
        worker = await pick()
        if worker is None:
            return JSONResponse({"detail": "no worker takes work"}, status_code=503)
        served[worker] += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        upstream = await http.send(http.build_request(
            request.method, worker + request.url.path, headers=headers,
            content=await request.body()), stream=True)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                 headers=kept, background=BackgroundTask(upstream.aclose))

    async def routed(request: Request) -> Response:
        return JSONResponse(served)

    async def remove_worker(request: Request) -> Response:
        removed.add(request.query_params.get("url", "").rstrip("/"))
        return JSONResponse({"removed": sorted(removed)})

    async def add_worker(request: Request) -> Response:
        url = request.query_params.get("url", "").rstrip("/")
        if url in workers and url not in removed:
            return JSONResponse({"detail": f"worker {url} already exists"}, status_code=400)
        removed.discard(url)
        return JSONResponse({"added": url})

    return Starlette(routes=[
        Route("/routed", routed, methods=["GET"]),
        Route("/remove_worker", remove_worker, methods=["POST"]),
        Route("/add_worker", add_worker, methods=["POST"]),
        Route("/{path:path}", route, methods=["GET", "POST"]),
    ])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="append", required=True)
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=120.0))
    run(build_app([w.rstrip("/") for w in args.worker], client), args.ready_file,
        on_close=client.aclose)
