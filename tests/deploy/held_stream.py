"""A streaming completion a test holds open (the engine shape holds it after a few tokens
until the test releases it), read chunk by chunk, and the processes still running."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psutil


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


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie waiting to be reaped has ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out
