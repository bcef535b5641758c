"""A streaming completion a test holds open (the engine shape holds it after a few tokens
until the test releases it), read chunk by chunk; a long-poll of ``/status`` until a
condition holds; and (from the engine tests) which processes still run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.engines.stack import alive
from tests.service.servers import Running

__all__ = ["Stream", "alive", "watch"]


class Stream:
    """``POST /v1/completions`` with ``stream: true``, its first chunk read at once."""

    def __init__(self, url: str, prompt: str, max_tokens: int) -> None:
        self._client = httpx.Client(timeout=90)
        self._context = self._client.stream("POST", url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": max_tokens, "stream": True})
        self._lines = self._context.__enter__().iter_lines()
        self.chunks: list[dict[str, Any]] = []
        self.done = False
        self._read_chunk()

    def _read_chunk(self) -> bool:
        for line in self._lines:
            if line == "data: [DONE]":
                self.done = True
                return False
            if line.startswith("data: {"):
                self.chunks.append(json.loads(line[6:]))
                return True
        return False

    def read_to_end(self) -> None:
        try:
            while self._read_chunk():
                pass
        finally:
            self._context.__exit__(None, None, None)
            self._client.close()

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["text"] for c in self.chunks)


def watch(coordinator: Running, done: Callable[[dict[str, Any]], bool], what: str,
          timeout: float = 60.0) -> dict[str, Any]:
    """Long-poll ``/status`` (each change bumps its generation) until ``done`` holds."""
    deadline = time.monotonic() + timeout
    params: dict[str, Any] = {}
    with coordinator.client(timeout=30) as client:
        while True:
            status: dict[str, Any] = client.get("/status", params=params).json()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}: "
                                     f"{status['phase']}")
            params = {"wait": 5, "since": status["generation"]}
