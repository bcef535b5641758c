"""A Dynamo worker whose requests migrate to another worker when the pod drains.

Dynamo's frontend already migrates a stream that ends without its final frame (``python -m
dynamo.frontend --migration-limit N`` with N > 0): it re-issues the request on another worker
with the tokens produced so far appended to the prompt. What is missing is telling a worker's
requests to stop *before* the kubelet kills it. This worker adds that with ``worker_client``:

1. at start-up it registers with the pod's shutdown-coordinator (``--coordinator`` or
   ``SHUTDOWN_COORDINATOR_URL``);
2. each request's generation runs inside ``client.track(request_id)``; when a drain starts
   (``shutdown_event``), the generation is interrupted between two tokens, the engine's work
   is aborted, and the handler raises Dynamo's ``EngineShutdown``: the frontend sees the
   stream end without a final frame and migrates the request. The frontend never
   acknowledges to the coordinator, so the client is built with ``handoff_ack="engine"``:
   each handoff is reported as already migrated, and the drain's migrating phase ends as
   soon as the worker holds nothing, instead of at its deadline;
3. at the same moment the worker withdraws its endpoint from discovery, so the frontend stops
   routing new requests to it (one that still arrives is handed back at once, the same way);
4. the coordinator then terminates the worker (SIGTERM) and Dynamo's own shutdown runs as
   usual: Dynamo's Rust worker owns SIGTERM/SIGINT, so ``install_graceful_shutdown`` is not
   used here (the drain comes from the coordinator's ``preStop`` hook instead).

The engine is a stand-in (``stand_in_engine.TokenEngine``, deterministic tokens); put a real
engine's generate and abort in its place to use the pattern with it.

Run (next to ``python -m dynamo.frontend --migration-limit 3``)::

    python deploy/examples/dynamo/drainable_worker.py --model-path DIR \\
        --coordinator http://127.0.0.1:8787 --discovery-backend file
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from dynamo.common.backend.engine import EngineConfig, LLMEngine, LlmRegistration
from dynamo.common.backend.run import run
from dynamo.common.backend.worker import WorkerConfig
from dynamo.llm.exceptions import EngineShutdown
from stand_in_engine import TokenEngine

from worker_client import WorkerClient

log = logging.getLogger("drainable_worker")


class DrainableEngine(LLMEngine):
    """An ``LLMEngine`` whose requests are handed back to Dynamo's frontend on a drain."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = TokenEngine(args.vocab_size, args.delay)
        self.client = WorkerClient(
            args.coordinator, role="dynamo-worker", name=f"dynamo-worker-{os.getpid()}",
            token=_read_token(args.coordinator_token_file),
            # Dynamo's frontend migrates the stream itself and acknowledges nothing here.
            handoff_ack="engine",
        )
        self._endpoint: Any = None
        self._withdrawn = False

    @classmethod
    async def from_args(
        cls, argv: list[str] | None = None
    ) -> tuple[DrainableEngine, WorkerConfig]:
        args = parse_args(argv)
        engine = cls(args)
        config = WorkerConfig(
            namespace=args.namespace, component=args.component, endpoint="generate",
            model_name=args.model_path, served_model_name=args.served_model_name,
            endpoint_types="chat,completions", discovery_backend=args.discovery_backend,
            request_plane="tcp", enable_kv_routing=False,
        )
        return engine, config

    async def start(self, worker_id: int) -> EngineConfig:
        # On the serving loop, so shutdown_event is set on it.
        self.client.start()
        self.client.on_drain(self._withdraw_from_discovery)
        return EngineConfig(
            model=self.args.model_path, served_model_name=self.args.served_model_name,
            llm=LlmRegistration(context_length=4096, kv_cache_block_size=16),
        )

    async def on_endpoint_ready(self, endpoint: Any) -> None:
        self._endpoint = endpoint

    async def generate(
        self, request: Any, context: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        request_id = str(context.id())
        prompt = list(request.get("token_ids", []))
        max_tokens = int((request.get("stop_conditions") or {}).get("max_tokens") or 16)
        log.info("tracking request %s (%d prompt tokens)", request_id, len(prompt))
        produced = 0
        async with self.client.track(request_id) as req:
            async for token in req.stream(self.engine.generate(request_id, prompt, max_tokens)):
                produced += 1
                chunk: dict[str, Any] = {"token_ids": [token], "index": 0}
                if produced == max_tokens:
                    chunk["finish_reason"] = "length"
                    chunk["completion_usage"] = {
                        "prompt_tokens": len(prompt), "completion_tokens": produced,
                        "total_tokens": len(prompt) + produced,
                    }
                yield chunk
        if req.handed_back:
            self.engine.abort(request_id)
            log.info("handed back request %s after %d tokens", request_id, produced)
            # No final frame: Dynamo's frontend migrates the request to another worker.
            raise EngineShutdown(f"worker draining; request handed back after {produced} tokens")

    async def abort(self, context: Any) -> None:
        self.engine.abort(str(context.id()))

    async def cleanup(self) -> None:
        self.client.close()

    def _withdraw_from_discovery(self) -> None:
        if self._endpoint is None or self._withdrawn:
            return
        self._withdrawn = True
        task = asyncio.ensure_future(self._endpoint.unregister_endpoint_instance())
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not withdraw the endpoint from discovery: %r", task.exception())


def _read_token(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-path", required=True,
                        help="local model dir (config.json + tokenizer.json) for the frontend")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per token")
    parser.add_argument("--namespace", default="dynamo")
    parser.add_argument("--component", default="backend")
    parser.add_argument("--discovery-backend",
                        default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"))
    parser.add_argument("--coordinator", default=os.environ.get("SHUTDOWN_COORDINATOR_URL"),
                        help="the pod's shutdown-coordinator [env SHUTDOWN_COORDINATOR_URL]")
    parser.add_argument("--coordinator-token-file",
                        default=os.environ.get("SHUTDOWN_COORDINATOR_TOKEN_FILE"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    run(DrainableEngine)
