"""What one row of ``bench/engine_profiles_dynamo.py`` observed: the streams through Dynamo's
frontend (tokens, workers, migrations, by each stream's ``x-request-id`` in the frontend's
log), the worker's own log lines about its shutdown, and the row's summary fields."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.engines.tiny_model import prompt

FIRST_CHUNKS = 5
"""Tokens each stream has received before the second worker starts."""
WAITING = "Waiting for inflight requests to complete"
TIMEOUTS = ("timed out", "force-exiting", "Traceback")
ERROR = re.compile(r"^\S+\s+ERROR ")
NEW_AT_S = 2.0
NEW_REQUESTS = 4
"""Short requests sent through the frontend from ``NEW_AT_S`` after the stop: where new
traffic goes while the worker is being stopped."""
AFTER_SIGTERM_REQUESTS = 2
"""Short requests sent once the worker logged its shutdown signal: where new traffic goes once
it has its SIGTERM."""
WORKER_LINES = ("Received shutdown signal", "DistributedRuntime shutdown complete",
                "Runtime shutdown initiated", "Phase ", "Active graceful endpoints", WAITING,
                "inflight", "timed out", "force-exiting", "Traceback", "Error", "error",
                "panicked")
"""What the worker logs about its own shutdown."""
UNREGISTER = "Failed to unregister"
"""Warnings the worker logs at shutdown (file discovery's keys already gone): counted only."""
MIGRATION = re.compile(r"migrat", re.IGNORECASE)
RETRY = re.compile(r"migration\.is_retry=true")
SELECTED = re.compile(r"Selected worker .*?worker_id=(\d+)")
RETRIED = re.compile(r"migration\.from_worker_id=(\d+) migration\.tokens_completed=(\d+)")
SETTLE_S = 30.0


@dataclass
class Stream:
    """A streaming completion through the frontend, one chunk per token naming its worker."""

    url: str
    max_tokens: int
    request_id: str
    tokens: int = 0
    by_worker: dict[int, int] = field(default_factory=dict)
    """Tokens per worker as the chunks name it (``nvext.worker_id``)."""
    routed: list[int] = field(default_factory=list)
    """The workers the frontend routed it to, in order (its log's ``Selected worker``)."""
    migrations: list[str] = field(default_factory=list)
    """The frontend's ``migration retry scheduled`` lines for it (from, tokens completed)."""
    finish: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    ended_at: float | None = None
    first: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"model": "tiny", "prompt": prompt(6), "max_tokens": self.max_tokens,
                "stream": True, "nvext": {"extra_fields": ["worker_id"]}}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300,
                              headers={"x-request-id": self.request_id}) as response:
                if response.status_code != 200:
                    response.read()
                    self.error = f"HTTP {response.status_code}: {response.text[:120]}"
                    return
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: {"):
                        self.take(json.loads(line[len("data: "):]))
                    elif "error" in line.lower():
                        self.error = line[:160]
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:160]
        finally:
            self.ended_at = time.time()
            self.first.set()

    def take(self, event: dict[str, Any]) -> None:
        if event.get("error"):
            self.error = json.dumps(event["error"])[:160]
        worker = ((event.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish.append(choice["finish_reason"])
            else:
                self.tokens += 1
                if worker is not None:
                    self.by_worker[int(worker)] = self.by_worker.get(int(worker), 0) + 1
        if self.tokens >= FIRST_CHUNKS:
            self.first.set()

    @property
    def whole(self) -> bool:
        return self.error is None and self.done and self.tokens == self.max_tokens

    def read_frontend(self, lines: list[str]) -> None:
        mine = [line for line in lines if f'x_request_id="{self.request_id}"' in line]
        for line in mine:
            if "Selected worker" in line and (found := SELECTED.search(line)):
                self.routed.append(int(found.group(1)))
            elif "migration retry scheduled" in line and (found := RETRIED.search(line)):
                self.migrations.append(f"from {found.group(1)} after {found.group(2)} tokens")


@dataclass
class Row:
    name: str
    worker_status: str = "-"
    outcome: str = "-"
    fates: list[str] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    workers: dict[int, str] = field(default_factory=dict)
    shutdown_signals: int = 0
    waited_inflight: int = 0
    timeouts: int = 0
    errors: int = 0
    new_routed: list[str] = field(default_factory=list)
    after_sigterm: list[str] = field(default_factory=list)
    in_flight_at_hook: int | None = None
    log_lines: list[str] = field(default_factory=list)
    migration_lines: list[str] = field(default_factory=list)
    retries: int = 0
    seconds: float = 0.0
    hook: str = ""
    kubelet_sigterm: str = ""
    sigkilled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def status_text(code: int) -> str:
    return str(code) if code >= 0 else signal.Signals(-code).name


def short(line: str, width: int = 110) -> str:
    """A Dynamo log line without its timestamp, cut to ``width`` characters."""
    text = line.strip()
    if re.match(r"^\d{4}-\d\d-\d\dT", text):
        text = text.split(" ", 1)[-1].strip()
    return text[:width]
