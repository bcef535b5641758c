"""A vLLM completions server whose in-flight streams are handed back when the pod drains.

vLLM's ``AsyncLLM`` does the inference; this module is the small OpenAI-style front it needs
to take part in a drain (``python -m vllm.entrypoints.openai.api_server`` cannot import
``worker_client``; use the unmodified-engine path for it):

1. at start-up the engine is built from vLLM's own flags, then the process registers with the
   pod's shutdown-coordinator (``--coordinator`` or ``SHUTDOWN_COORDINATOR_URL``), declaring
   the kill tiers vLLM's tree needs (EngineCore first: it stops its own Worker processes);
2. each request's generation runs inside ``client.track(request_id)``: when a drain starts,
   the request's wait on the engine is cancelled (the race between the request and
   ``shutdown_event``), the request is aborted in the engine (``AsyncLLM.abort``: its KV cache
   and scheduler slot are freed at once), and the stream ends with a ``handed_back`` event
   instead of ``[DONE]``, so the router continues it on another worker;
3. ``install_graceful_shutdown`` puts the drain in front of uvicorn's SIGTERM handling: a
   SIGTERM that reaches this process first (no preStop hook) drains, then uvicorn stops and
   the engine shuts down as usual;
4. once a drain is on and the kill stopped EngineCore (its tier comes first), the server stops
   by itself and exits 0, as vLLM's own API server does when its engine is gone. That is what
   lets the multiprocessing ``resource_tracker`` child (it ignores SIGTERM and leaves when its
   parent does) end without SIGKILL.

Streaming convention (the project's router convention): ``POST /v1/completions`` with
``stream: true`` and an ``X-Request-Id`` header; SSE ``data:`` lines ``{"id", "choices":
[{"index", "text", "finish_reason"}]}``, then ``[DONE]``, or a last
``{"handed_back": true, "request_id", "tokens"}`` and no ``[DONE]``.

Run::

    python deploy/examples/vllm/drainable_server.py --model DIR --host 0.0.0.0 --port 8000 \\
        --coordinator http://127.0.0.1:8787
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine.async_llm import AsyncLLM

from worker_client import Tier, WorkerClient, handed_back_event, install_graceful_shutdown

log = logging.getLogger("drainable_server")

VLLM_TIERS = (
    # EngineCore's SIGTERM handler shuts its executor down, which stops the Worker processes
    # and waits for them. A Worker stopped first is "died unexpectedly" to EngineCore and the
    # whole engine is declared dead. (Same table: deploy/examples/unmodified/engine_tiers.py.)
    Tier("engine-core", pattern=r"VLLM::(EngineCore|DPCoordinator)", timeout_s=30),
    Tier("workers", pattern=r"VLLM::Worker", timeout_s=10),
)


ENGINE_CHECK_S = 0.2
"""How often a draining server checks whether its engine core is gone (only while draining)."""


class Server(uvicorn.Server):
    """uvicorn, minus its re-raise of the stop signal after serving.

    uvicorn restores the previous handlers after serving and raises the captured signal again,
    so a server stopped by SIGTERM dies of it (exit -15). A drained worker must exit 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def stop_when_engine_gone(
    server: uvicorn.Server, engine: AsyncLLM, client: WorkerClient
) -> None:
    """During a drain, stop serving once the engine core is gone (its tier ran)."""
    await client.shutdown_event.wait()
    # AsyncLLM tells of its engine's death only as a property (vLLM's API server polls it too).
    while not (engine.errored or server.should_exit):  # noqa: ASYNC110
        await asyncio.sleep(ENGINE_CHECK_S)
    server.should_exit = True


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def build_app(
    engine_args: AsyncEngineArgs, client: WorkerClient, model_name: str,
    server: list[uvicorn.Server],
) -> FastAPI:
    state: dict[str, AsyncLLM] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = state["engine"] = AsyncLLM.from_engine_args(engine_args)
        # On the serving loop, after uvicorn installed its signal handlers (they run after
        # the drain).
        client.start()
        install_graceful_shutdown(client)
        watcher = asyncio.create_task(stop_when_engine_gone(server[0], engine, client))
        try:
            yield
        finally:
            watcher.cancel()
            client.close()
            engine.shutdown()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        request_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
        params = SamplingParams(
            max_tokens=int(body.get("max_tokens", 16)),
            temperature=float(body.get("temperature", 0.0)),
            ignore_eos=bool(body.get("ignore_eos", False)),
            output_kind=RequestOutputKind.DELTA,
        )
        chunks = generate(state["engine"], client, request_id, str(body["prompt"]), params)
        if body.get("stream"):
            return StreamingResponse(chunks, media_type="text/event-stream")
        return await collect(chunks, request_id, model_name)

    return app


async def generate(
    engine: AsyncLLM, client: WorkerClient, request_id: str, prompt: str, params: SamplingParams
) -> AsyncIterator[bytes]:
    """One request's SSE stream; ends with ``handed_back`` when a drain interrupts it."""
    produced = 0
    async with client.track(request_id) as req:
        async for output in req.stream(engine.generate(prompt, params, request_id)):
            completion = output.outputs[0]
            produced += len(completion.token_ids)
            req.tokens = produced
            yield sse({"id": request_id, "object": "text_completion", "choices": [
                {"index": 0, "text": completion.text, "finish_reason": completion.finish_reason},
            ]})
    if req.handed_back:
        # The cancelled wait already made vLLM abort it; abort again in case the drain caught
        # the request between two outputs (abort of a finished request is a no-op).
        await engine.abort(request_id)
        log.info("handed back request %s after %d tokens", request_id, produced)
        yield sse(handed_back_event(request_id, produced))
        return
    yield sse("[DONE]")


async def collect(chunks: AsyncIterator[bytes], request_id: str, model: str) -> JSONResponse:
    """The non-streaming answer; a handed-back request is a 503 the router retries."""
    text, finish = [], None
    async for raw in chunks:
        data = raw.decode().removeprefix("data: ").strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("handed_back"):
            return JSONResponse(event, status_code=503, headers={"Retry-After": "0"})
        text.append(event["choices"][0]["text"])
        finish = event["choices"][0]["finish_reason"] or finish
    return JSONResponse({"id": request_id, "object": "text_completion", "model": model,
                         "choices": [{"index": 0, "text": "".join(text),
                                      "finish_reason": finish}]})


def main() -> None:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--coordinator", default=os.environ.get("SHUTDOWN_COORDINATOR_URL"))
    parser.add_argument("--coordinator-token-file",
                        default=os.environ.get("SHUTDOWN_COORDINATOR_TOKEN_FILE"))
    parser.add_argument("--advertise-url", default=None,
                        help="URL routers use to reach this worker (default: http://host:port)")
    parser = AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    token = None
    if args.coordinator_token_file:
        with open(args.coordinator_token_file, encoding="utf-8") as f:
            token = f.read().strip() or None
    client = WorkerClient(
        args.coordinator, token=token, role="vllm", name=f"vllm-{os.getpid()}",
        url=args.advertise_url or f"http://{args.host}:{args.port}", tiers=VLLM_TIERS,
    )
    model_name = (args.served_model_name or [args.model])[0]
    server: list[uvicorn.Server] = []
    app = build_app(engine_args, client, model_name, server)
    server.append(Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info")))
    server[0].run()


if __name__ == "__main__":
    main()
