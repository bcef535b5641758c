"""An SGLang completions server whose in-flight streams are handed back when the pod drains.

``sglang.Engine`` does the inference in this process (its tokenizer manager runs on the
server's event loop; schedulers and the detokenizer are its children). What this module adds:

1. the process registers with the pod's shutdown-coordinator (``--coordinator`` or
   ``SHUTDOWN_COORDINATOR_URL``) with SGLang's kill tiers (schedulers, then the data-parallel
   controller, then the detokenizer, the main process last);
2. each request runs inside ``client.track(rid)``: the request's wait on the engine races
   ``shutdown_event`` (the upstream pattern); when the drain wins, the request is aborted in
   the engine (``tokenizer_manager.abort_request``: the scheduler frees its KV cache) and the
   stream ends with a ``handed_back`` event instead of ``[DONE]``;
3. SGLang's own signal handlers still run: ``install_graceful_shutdown`` is installed on the
   serving loop *before* the engine's first request, so the SIGTERM/SIGQUIT handlers the
   tokenizer manager adds then with ``loop.add_signal_handler`` are captured and run after the
   drain (SIGTERM: SGLang's own drain-and-exit) instead of being bypassed;
4. a pre-kill hook stands SGLang's ``SubprocessWatchdog`` down and asks the schedulers to
   release their resources and exit (``ShutdownReq``, what SGLang's own SIGTERM path sends),
   so the coordinator's children-first kill finds them exiting, and the watchdog does not
   turn their exit into a SIGQUIT that SIGKILLs the whole tree.

Not run on this project's CI machines: SGLang's wheel pins a CUDA torch and CUDA kernels
(see docs/engines.md for what was and was not tested).

Streaming convention and run line: as deploy/examples/vllm/drainable_server.py::

    python deploy/examples/sglang/drainable_server.py --model-path DIR --port 30000 \\
        --coordinator http://127.0.0.1:8787
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import sglang
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from worker_client import Tier, WorkerClient, handed_back_event, install_graceful_shutdown

log = logging.getLogger("drainable_sglang")

SGLANG_TIERS = (
    # Same table: deploy/examples/unmodified/engine_tiers.py.
    Tier("schedulers", pattern=r"sglang::scheduler", timeout_s=30),
    Tier("dp-controller", pattern=r"sglang::data_parallel_controller", timeout_s=10),
    Tier("detokenizer", pattern=r"sglang::(detokenizer|tokenizer_worker)", timeout_s=10),
)


class Server(uvicorn.Server):
    """uvicorn without its re-raise of the stop signal after serving (a drained worker
    exits 0, not -15)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def stand_down(engine: Any) -> None:
    """Pre-kill hook: stop SGLang's child watchdog and ask the schedulers to exit cleanly."""
    manager = engine.tokenizer_manager
    watchdog = getattr(manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    try:
        from sglang.srt.managers.io_struct import ShutdownReq

        manager._dispatch_to_scheduler(ShutdownReq())
    except Exception:  # an older SGLang without ShutdownReq: the tiers' SIGTERM does it
        log.exception("could not ask the schedulers to shut down")


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


async def generate(
    engine: Any, client: WorkerClient, rid: str, prompt: str, sampling: dict[str, Any]
) -> AsyncIterator[bytes]:
    """One request's SSE stream; ends with ``handed_back`` when a drain interrupts it."""
    produced, sent = 0, 0
    async with client.track(rid) as req:
        chunks = await req.run(engine.async_generate(
            prompt=prompt, sampling_params=sampling, stream=True, rid=rid))
        async for out in req.stream(chunks):
            text: str = out.get("text") or ""
            meta = out.get("meta_info", {})
            produced = int(meta.get("completion_tokens", produced))
            req.tokens = produced
            finish = meta.get("finish_reason")
            yield sse({"id": rid, "object": "text_completion", "choices": [
                {"index": 0, "text": text[sent:],
                 "finish_reason": finish.get("type") if isinstance(finish, dict) else finish},
            ]})
            sent = len(text)
    if req.handed_back:
        engine.tokenizer_manager.abort_request(rid=rid)
        log.info("handed back request %s after %d tokens", rid, produced)
        yield sse(handed_back_event(rid, produced))
        return
    yield sse("[DONE]")


def build_app(engine_kwargs: dict[str, Any], client: WorkerClient) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before the engine's first request: its loop signal handlers are added then, and
        # must land behind the drain.
        client.start()
        install_graceful_shutdown(client)
        engine = state["engine"] = sglang.Engine(**engine_kwargs)
        client.add_prekill_hook(lambda: stand_down(engine))
        try:
            yield
        finally:
            client.close()
            engine.shutdown()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        rid = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
        sampling = {"max_new_tokens": int(body.get("max_tokens", 16)),
                    "temperature": float(body.get("temperature", 0.0)),
                    "ignore_eos": bool(body.get("ignore_eos", False))}
        chunks = generate(state["engine"], client, rid, str(body["prompt"]), sampling)
        return StreamingResponse(chunks, media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--coordinator", default=os.environ.get("SHUTDOWN_COORDINATOR_URL"))
    parser.add_argument("--advertise-url", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    client = WorkerClient(
        args.coordinator, role="sglang", name=f"sglang-{os.getpid()}", tiers=SGLANG_TIERS,
        url=args.advertise_url or f"http://{args.host}:{args.port}",
    )
    app = build_app({"model_path": args.model_path, "tp_size": args.tp_size}, client)
    Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info")).run()


if __name__ == "__main__":
    main()
