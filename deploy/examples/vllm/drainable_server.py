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

Requests as vLLM's OpenAI server takes them, so the routers and the continuation proxy in
front treat it as one: ``POST /v1/completions`` (``prompt`` as text or as token ids, which is
how the proxy continues a completion token-exactly), ``POST /v1/chat/completions`` (the
model's chat template), ``return_token_ids`` (each chunk carries its token ids, the first the
prompt's), and ``GET /v1/models``, which routers probe a worker with. Streaming follows the
project's router convention: ``stream: true`` and an ``X-Request-Id`` header; SSE ``data:``
lines as vLLM words them, then ``[DONE]``, or a last ``{"handed_back": true, "request_id",
"tokens"}`` and no ``[DONE]``, ``tokens`` counting the tokens in the chunks sent.

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
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from vllm import SamplingParams, TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine.async_llm import AsyncLLM

from worker_client import Tier, WorkerClient, handed_back_event, install_graceful_shutdown

log = logging.getLogger("drainable_server")

ENGINE_CORE_TIER_S = 75.0
"""How long EngineCore gets from its SIGTERM to its exit, its Workers' exits included."""
WORKER_EXIT_S = 60
"""How long EngineCore lets its Workers leave by themselves before it SIGTERMs them (vLLM's
``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, 5 s by default; SIGKILL 4 s after that). A Worker
told to stop spends seconds of CPU in its own teardown, one thread busy with no Python frame
left, and vLLM pins every Worker's threads to the same core here: with other engines
running, a stock vLLM's Worker took 10 s to exit and the drained server's more than 20 s, was
SIGTERMed by EngineCore while it was leaving, and died of it (exit -15). Set inside
EngineCore's tier, the Worker's own exit is waited for and only a stuck one is signalled. An
operator's value is kept."""
VLLM_TIERS = (
    # EngineCore's SIGTERM handler shuts its executor down, which stops the Worker processes
    # and waits for them. A Worker stopped first is "died unexpectedly" to EngineCore and the
    # whole engine is declared dead. (Same table: deploy/examples/unmodified/engine_tiers.py.)
    Tier("engine-core", pattern=r"VLLM::(EngineCore|DPCoordinator)",
         timeout_s=ENGINE_CORE_TIER_S),
    Tier("workers", pattern=r"VLLM::Worker", timeout_s=10),
)


COMPLETION_MAX_TOKENS = 16
"""A completion's ``max_tokens`` when it does not say (OpenAI's default, and vLLM's)."""
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


class BadRequest(ValueError):
    """A request this server cannot take: a 400 with this message."""


@dataclass
class Job:
    """One request as the engine takes it, and how its chunks are worded."""

    request_id: str
    prompt: str | TokensPrompt
    params: SamplingParams
    chat: bool
    token_ids: bool
    """``return_token_ids``: each chunk carries its token ids, the first the prompt's."""
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, text: str, ids: list[int], finish: str | None,
              prompt_ids: list[int] | None) -> dict[str, Any]:
        """A streamed chunk as vLLM's OpenAI server words it."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        if self.token_ids:
            choice["token_ids"] = ids
            if prompt_ids is not None:
                choice["prompt_token_ids"] = prompt_ids
        return {"id": self.request_id, "created": self.created, "model": self.model,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "choices": [choice]}


def sampling(body: dict[str, Any], default_max: int) -> SamplingParams:
    """The sampling a request asks for (the OpenAI fields vLLM's server reads too)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    return SamplingParams(
        max_tokens=default_max if limit is None else int(limit),
        min_tokens=int(body.get("min_tokens") or 0),
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else stop,
        ignore_eos=bool(body.get("ignore_eos", False)),
        output_kind=RequestOutputKind.DELTA,
    )


def completion_job(body: dict[str, Any], request_id: str, model: str) -> Job:
    """A completion: its prompt is text, or token ids (a continuation's, exact)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        engine_prompt: str | TokensPrompt = TokensPrompt(prompt_token_ids=prompt)
    elif isinstance(prompt, str):
        engine_prompt = prompt
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids")
    return Job(request_id, engine_prompt, sampling(body, COMPLETION_MAX_TOKENS), chat=False,
               token_ids=bool(body.get("return_token_ids")), model=model)


def chat_job(body: dict[str, Any], request_id: str, model: str, engine: AsyncLLM) -> Job:
    """A chat completion: the messages rendered with the model's chat template, as vLLM's
    server does (``add_generation_prompt``, ``continue_final_message`` for an open assistant
    message, no special tokens added), and tokenized here."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    tokenizer = engine.get_tokenizer()
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)))
    except (ValueError, TypeError, KeyError) as exc:
        raise BadRequest(f"the messages do not render: {exc}") from exc
    ids = tokenizer.encode(str(text), add_special_tokens=bool(body.get("add_special_tokens")))
    left = engine.model_config.max_model_len - len(ids)
    return Job(request_id, TokensPrompt(prompt_token_ids=ids, prompt=str(text)),
               sampling(body, left), chat=True, token_ids=bool(body.get("return_token_ids")),
               model=model)


def build_app(
    engine_args: AsyncEngineArgs, client: WorkerClient, model_name: str,
    server: list[uvicorn.Server],
) -> FastAPI:
    state: dict[str, AsyncLLM] = {}
    started = int(time.time())

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

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        # What routers probe a worker with (smg tells vLLM by ``owned_by``).
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": started, "owned_by": "vllm",
            "root": engine_args.model, "parent": None,
            "max_model_len": state["engine"].model_config.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body, request_id = await _read(request, "cmpl")
        return await serve(lambda: completion_job(body, request_id, model_name), body)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body, request_id = await _read(request, "chatcmpl")
        return await serve(
            lambda: chat_job(body, request_id, model_name, state["engine"]), body)

    async def serve(make: Callable[[], Job], body: dict[str, Any]) -> Any:
        try:
            job = make()
        except (BadRequest, ValueError, TypeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError",
                                           "code": 400}}, status_code=400)
        chunks = generate(state["engine"], client, job)
        if body.get("stream"):
            return StreamingResponse(chunks, media_type="text/event-stream")
        return await collect(chunks, job)

    return app


async def _read(request: Request, prefix: str) -> tuple[dict[str, Any], str]:
    body = await request.json()
    if not isinstance(body, dict):
        body = {}
    return body, request.headers.get("x-request-id") or f"{prefix}-{uuid.uuid4().hex}"


async def generate(engine: AsyncLLM, client: WorkerClient, job: Job) -> AsyncIterator[bytes]:
    """One request's SSE stream; ends with ``handed_back`` when a drain interrupts it. The
    count it hands back is of the tokens in the chunks sent, so a continuation resumes right
    after them."""
    produced = 0
    prompt_ids: list[int] | None = None
    request_id = job.request_id
    async with client.track(request_id) as req:
        if job.chat:  # the role comes first, alone, as vLLM sends it
            yield sse({**job.chunk("", [], None, None), "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "finish_reason": None}]})
        async for output in req.stream(engine.generate(job.prompt, job.params, request_id)):
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            if not ids and not completion.text and completion.finish_reason is None:
                continue
            produced += len(ids)
            req.tokens = produced
            first = prompt_ids is None
            prompt_ids = list(output.prompt_token_ids or ())
            yield sse(job.chunk(completion.text, ids, completion.finish_reason,
                                prompt_ids if first else None))
    if req.handed_back:
        # The cancelled wait already made vLLM abort it; abort again in case the drain caught
        # the request between two outputs (abort of a finished request is a no-op).
        await engine.abort(request_id)
        log.info("handed back request %s after %d tokens", request_id, produced)
        yield sse(handed_back_event(request_id, produced))
        return
    yield sse("[DONE]")


async def collect(chunks: AsyncIterator[bytes], job: Job) -> JSONResponse:
    """The non-streaming answer; a handed-back request is a 503 the router retries."""
    text: list[str] = []
    ids: list[int] = []
    prompt_ids, finish = None, None
    async for raw in chunks:
        data = raw.decode().removeprefix("data: ").strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("handed_back"):
            return JSONResponse(event, status_code=503, headers={"Retry-After": "0"})
        choice = event["choices"][0]
        text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
        ids += choice.get("token_ids") or []
        prompt_ids = choice.get("prompt_token_ids") or prompt_ids
        finish = choice["finish_reason"] or finish
    answer: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if job.chat:
        answer["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        answer["text"] = "".join(text)
    if job.token_ids:
        answer.update(token_ids=ids, prompt_token_ids=prompt_ids)
    return JSONResponse({"id": job.request_id, "created": job.created, "model": job.model,
                         "object": "chat.completion" if job.chat else "text_completion",
                         "choices": [answer]})


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
    # Read by EngineCore, a child started with this environment.
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(WORKER_EXIT_S))
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
