"""A reference router: a streaming completions proxy that continues handed-back requests.

    python -m devstack.reference_router --port 0 \\
        --worker http://127.0.0.1:8001=http://127.0.0.1:8787 --worker ...

``POST /v1/completions`` (OpenAI-style, ``stream`` true or false) goes to a worker that is not
draining (fewest requests in flight from this router). Each upstream attempt carries its own
``X-Request-Id``: ``<client request id>.<attempt>``. When an upstream stream ends with the
handed-back event (or breaks: connection lost, no ``[DONE]``), the router acknowledges the
handoff to the worker's coordinator and continues on another worker with the text already
streamed appended to the prompt and ``max_tokens`` reduced by the chunks already streamed (one
chunk is one token), so the client's stream has no gap and no duplicate. ``--resume restart``
instead re-issues the original request from scratch (what a router without migration does;
the benchmark's baseline). ``GET /stats`` counts requests, completions, continuations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from router_client import sse
from router_client.watch import Watcher

NO_WORKER_WAIT_S = 10.0
"""How long a request waits for a worker that is not draining before it fails (s)."""


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    continued: int = 0
    """Continuations started on another worker (handed back or broken)."""
    handed_back: int = 0
    broken: int = 0
    attempts: int = 0
    tokens: int = 0
    """Chunks forwarded to clients."""


class Router:
    """Chooses workers and runs each request's upstream attempts."""

    def __init__(self, watcher: Watcher, *, resume: str = "continue", max_attempts: int = 0,
                 standby: frozenset[str] = frozenset()):
        self.watcher = watcher
        self.resume = resume
        self.workers = list(watcher.workers)
        self.standby = standby
        """Workers that only take continuations (spare capacity), never a first attempt."""
        self.max_attempts = max_attempts or 2 * len(self.workers) + 2
        self.active = dict.fromkeys(self.workers, 0)
        self.stats = Stats()
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=60.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._background: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        await self.http.aclose()

    async def pick(self, avoid: set[str], first: bool) -> str | None:
        """A worker that is not draining (preferring ones not in ``avoid``), or None."""

        def candidates() -> list[str]:
            open_ = [w for w in self.workers if not self.watcher.is_draining(w)
                     and not (first and w in self.standby)]
            return [w for w in open_ if w not in avoid] or open_

        await self.watcher.wait_for(lambda: bool(candidates()), NO_WORKER_WAIT_S)
        found = candidates()
        return min(found, key=lambda w: self.active[w]) if found else None

    async def stream(self, request_id: str, prompt: str, max_tokens: int) -> AsyncIterator[bytes]:
        """The client's SSE stream: upstream attempts stitched together, then ``[DONE]``."""
        self.stats.requests += 1
        sent_text: list[str] = []
        avoid: set[str] = set()
        created = int(time.time())
        for attempt in range(self.max_attempts):
            remaining = max_tokens - len(sent_text)
            if remaining <= 0 and attempt > 0:
                break
            worker = await self.pick(avoid, first=attempt == 0)
            if worker is None:
                break
            upstream_id = f"{request_id}.{attempt}"
            body = {"prompt": prompt + "".join(sent_text), "max_tokens": remaining, "stream": True}
            if self.resume == "restart":
                body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
            outcome = "broken"
            self.active[worker] += 1
            self.stats.attempts += 1
            try:
                async with self.http.stream(
                    "POST", f"{worker}/v1/completions", json=body,
                    headers={"X-Request-Id": upstream_id},
                ) as resp:
                    if resp.status_code != 200:
                        outcome = "refused"
                    else:
                        async for event in sse.events(resp.aiter_lines()):
                            if event == sse.DONE:
                                outcome = "done"
                                break
                            assert isinstance(event, dict)
                            if event.get("handed_back"):
                                outcome = "handed_back"
                                break
                            text = sse.chunk_text(event)
                            sent_text.append(text)
                            self.stats.tokens += 1
                            yield sse.encode({**event, "id": request_id, "created": created})
            except httpx.HTTPError:
                outcome = "broken"
            finally:
                self.active[worker] -= 1
            if outcome == "done":
                self.stats.completed += 1
                yield sse.encode(sse.DONE)
                return
            avoid.add(worker)
            if outcome == "handed_back":
                self.stats.handed_back += 1
                self._ack_later(worker, upstream_id)
                # Its whole pod is draining, even if /status has not said so here yet.
                pod = self.watcher.coordinator_of(worker)
                avoid.update(w for w in self.workers if self.watcher.coordinator_of(w) == pod)
            elif outcome == "broken":
                self.stats.broken += 1
            if outcome != "refused" and attempt + 1 < self.max_attempts:
                self.stats.continued += 1
        if len(sent_text) >= max_tokens and self.resume == "continue":
            self.stats.completed += 1
            yield sse.encode(sse.DONE)
            return
        self.stats.failed += 1
        yield sse.encode({"error": {"message": "no worker could complete the request",
                                    "request_id": request_id}})

    def _ack_later(self, worker: str, upstream_id: str) -> None:
        # The continuation must not wait for the acknowledgement's round trip.
        coordinator = self.watcher.coordinator_of(worker)
        task = asyncio.create_task(self.watcher.ack([upstream_id], coordinator))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def build_app(router: Router) -> Starlette:
    """The router's ASGI app."""

    async def completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            prompt = body.get("prompt", "")
            max_tokens = int(body.get("max_tokens", 16))
            stream = bool(body.get("stream", False))
            if not isinstance(prompt, str) or max_tokens < 0:
                raise ValueError("prompt must be a string and max_tokens >= 0")
        except (ValueError, TypeError, AttributeError) as exc:
            return JSONResponse({"detail": f"invalid request: {exc}"}, status_code=422)
        request_id = request.headers.get("x-request-id") or f"rt-{uuid.uuid4().hex[:16]}"
        chunks = router.stream(request_id, prompt, max_tokens)
        if stream:
            return StreamingResponse(chunks, media_type="text/event-stream",
                                     headers={"X-Request-Id": request_id})
        return await _whole(request_id, chunks)

    async def stats(request: Request) -> Response:
        return JSONResponse(asdict(router.stats))

    async def workers(request: Request) -> Response:
        return JSONResponse([
            {"url": w, "coordinator": router.watcher.coordinator_of(w),
             "draining": router.watcher.is_draining(w), "active": router.active[w]}
            for w in router.workers
        ])

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/workers", workers, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])


async def _whole(request_id: str, chunks: AsyncIterator[bytes]) -> Response:
    text: list[str] = []
    async for line in sse.events(_lines(chunks)):
        if isinstance(line, dict):
            if "error" in line:
                return JSONResponse(line, status_code=502)
            text.append(sse.chunk_text(line))
    return JSONResponse({"id": request_id, "object": "text_completion",
                         "choices": [{"index": 0, "text": "".join(text),
                                      "finish_reason": "length"}],
                         "usage": {"completion_tokens": len(text)}})


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    async for chunk in chunks:
        for line in chunk.decode().split("\n"):
            yield line


def _parse_worker(value: str) -> tuple[str, str]:
    worker, sep, coordinator = value.partition("=")
    if not sep or not worker or not coordinator:
        raise argparse.ArgumentTypeError("expected WORKER_URL=COORDINATOR_URL")
    return worker.rstrip("/"), coordinator.rstrip("/")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devstack.reference_router",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--worker", action="append", type=_parse_worker, required=True,
                        metavar="URL=COORDINATOR_URL", help="a worker and its coordinator")
    parser.add_argument("--standby-worker", action="append", type=_parse_worker, default=[],
                        metavar="URL=COORDINATOR_URL",
                        help="a worker that only takes continuations of other workers' requests")
    parser.add_argument("--token", default=os.environ.get("SHUTDOWN_COORDINATOR_TOKEN"),
                        help="bearer token for the coordinators (env SHUTDOWN_COORDINATOR_TOKEN)")
    parser.add_argument("--resume", choices=("continue", "restart"), default="continue",
                        help="continue a handed-back request, or restart it from scratch")
    parser.add_argument("--ready-file", help="write {pid, port, url} here once listening")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    watcher = Watcher(dict(args.worker + args.standby_worker), token=args.token)
    watcher.start()
    standby = frozenset(w for w, _ in args.standby_worker)
    router = Router(watcher, resume=args.resume, standby=standby)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(router), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    sock.listen(2048)  # connections queue from now on, before uvicorn starts accepting
    ready = {"pid": os.getpid(), "port": port, "url": f"http://{args.host}:{port}"}
    if args.ready_file:
        _write_atomically(args.ready_file, json.dumps(ready))
    print(json.dumps(ready), flush=True)
    try:
        await server.serve(sockets=[sock])
    finally:
        await router.close()
        await watcher.close()


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
