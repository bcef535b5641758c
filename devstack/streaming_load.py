"""Concurrent streaming completions through a router, each checked against the tokens the
simulated engines produce for its prompt (``devstack.sim.tokens.expected_tokens``).

The demo, the migration tests and the drain benchmark all drain a pod under this load.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from devstack.sim.tokens import expected_tokens
from router_client import sse


@dataclass
class ClientStream:
    """What one client asked for and saw."""

    prompt: str
    max_tokens: int
    tokens: list[str] = field(default_factory=list)
    done: bool = False
    """``[DONE]`` arrived."""
    done_at: float | None = None
    """``time.monotonic()`` when ``[DONE]`` arrived."""
    error: str | None = None
    """The error event, handoff or HTTP error that ended the stream early."""

    def expected(self) -> list[str]:
        """The tokens the engines produce for this prompt."""
        return expected_tokens(self.prompt, self.max_tokens)

    @property
    def exact(self) -> bool:
        """Completed with exactly the expected tokens, in order."""
        return self.done and self.tokens == self.expected()

    def missing_duplicated(self) -> tuple[int, int]:
        """(missing, duplicated) tokens: expected ones never received, and received ones
        beyond what was expected (counted as multisets, so order does not matter)."""
        have, need = Counter(self.tokens), Counter(self.expected())
        return sum((need - have).values()), sum((have - need).values())


class StreamingLoad:
    """One streaming completion per prompt, all at once, through ``url``.

    ``flowing`` is set once every stream has ``warm_tokens`` tokens (a stream that ends before
    counts too, so it cannot hold back whoever waits). Client ``i`` sends
    ``X-Request-Id: {request_id_prefix}{i}``. An error or handoff event, or an HTTP error, ends
    a stream with ``error`` set; ``run`` returns when every stream ended.
    """

    def __init__(self, url: str, prompts: Sequence[str], max_tokens: int, *,
                 request_id_prefix: str, warm_tokens: int = 3, timeout_s: float = 120.0,
                 ) -> None:
        self.url = url
        self.streams = [ClientStream(prompt, max_tokens) for prompt in prompts]
        self.flowing = asyncio.Event()
        self.request_id_prefix = request_id_prefix
        self.warm_tokens = warm_tokens
        self.timeout_s = timeout_s
        self._warm = 0

    async def run(self) -> list[ClientStream]:
        limits = httpx.Limits(max_connections=len(self.streams) + 8)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                     limits=limits) as http:
            await asyncio.gather(*(self._one(http, i, s) for i, s in enumerate(self.streams)))
        return self.streams

    def _warmed(self) -> None:
        self._warm += 1
        if self._warm == len(self.streams):
            self.flowing.set()

    async def _one(self, http: httpx.AsyncClient, i: int, stream: ClientStream) -> None:
        body = {"prompt": stream.prompt, "max_tokens": stream.max_tokens, "stream": True}
        headers = {"X-Request-Id": f"{self.request_id_prefix}{i}"}
        try:
            async with http.stream("POST", f"{self.url}/v1/completions", json=body,
                                   headers=headers) as response:
                async for event in sse.events(response.aiter_lines()):
                    if event == sse.DONE:
                        stream.done = True
                        stream.done_at = time.monotonic()
                        break
                    if not isinstance(event, dict) or "error" in event \
                            or event.get("handed_back"):
                        stream.error = json.dumps(event)
                        break
                    stream.tokens.append(sse.chunk_text(event))
                    if len(stream.tokens) == self.warm_tokens:
                        self._warmed()
        except httpx.HTTPError as exc:
            stream.error = repr(exc)
        finally:
            if len(stream.tokens) < self.warm_tokens:
                self._warmed()
