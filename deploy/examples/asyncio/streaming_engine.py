"""The smallest engine shutdown-coordinator drains: completions streamed as server-sent
events (stand-in tokens) by an asyncio server, registered through worker_client.

    SHUTDOWN_COORDINATOR_URL=http://127.0.0.1:8787 \
    SHUTDOWN_COORDINATOR_TOKEN_FILE=/var/run/shutdown-coordinator/token/token \
        python3 streaming_engine.py 8000

A drain hands every stream in flight back: it ends with the handed-back event instead of
[DONE], and a router continues it on another worker. SIGTERM, after the drain, exits 0.
"""

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from worker_client import WorkerClient, handed_back_event, install_graceful_shutdown

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
# The coordinator's URL and token come from the variables every manifest sets.
client = WorkerClient(role="worker", url=f"http://127.0.0.1:{PORT}")


async def generate(prompt: str, max_tokens: int) -> AsyncIterator[str]:
    """Stands in for your engine's generation: one piece of text a token."""
    for i in range(max_tokens):
        await asyncio.sleep(0.05)
        yield f" {prompt}-{i}"


def sse(data: dict[str, Any] | str) -> bytes:  # one server-sent event
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def stream(request_id: str, prompt: str, max_tokens: int) -> AsyncIterator[bytes]:
    async with client.track(request_id) as req:  # in flight until it ends or is handed back
        async for text in req.stream(generate(prompt, max_tokens)):
            yield sse({"id": request_id, "choices": [{"index": 0, "text": text}]})
    if req.handed_back:  # the drain ended it: the router continues it elsewhere
        yield sse(handed_back_event(request_id, req.tokens))
    else:
        yield sse("[DONE]")


async def completions(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # POST /v1/completions, one request a connection
    lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    headers = {k.lower(): v for k, _, v in (h.partition(": ") for h in lines[1:] if h)}
    body = json.loads(await reader.readexactly(int(headers["content-length"])))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Connection: close\r\n\r\n")
    request_id = headers.get("x-request-id", "request")
    async for event in stream(request_id, body["prompt"], body["max_tokens"]):
        writer.write(event)
        await writer.drain()
    writer.close()


async def main() -> None:
    client.start()  # on this loop: registers in the background, retried
    install_graceful_shutdown(client)  # SIGTERM: the drain first, then the handler below
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with await asyncio.start_server(completions, "127.0.0.1", PORT):
        await stop.wait()
    client.close()


asyncio.run(main())
