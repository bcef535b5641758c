"""Dynamo's own frontend migrates a stream away from a worker that a coordinator drains."""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.routers import free_port, log_tail
from tests.engines.stack import (
    DYNAMO_START_S,
    LOOPBACK_ENV,
    ROOT,
    Coordinator,
    alive,
    engine_python,
    http_ok,
    spawn_logged,
    start_coordinator,
    tree,
)
from tests.engines.tiny_model import VOCAB_SIZE, prompt, vocabulary
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

WORKER = ROOT / "deploy" / "examples" / "dynamo" / "drainable_worker.py"
MAX_TOKENS = 200
PROMPT_WORDS = 6
DRAIN_AFTER = 5
"""Streamed chunks the client has seen when the drain starts (mid-stream, far from its end)."""


def expected_words() -> list[str]:
    """What the whole stream must say: the example engine's deterministic tokens."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        from stand_in_engine import next_token  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(WORKER.parent))
    words = {i: w for w, i in vocabulary().items()}
    return [words[next_token(PROMPT_WORDS + i, VOCAB_SIZE)] for i in range(MAX_TOKENS)]


@dataclass
class Stream:
    """A streaming completion read in a thread; ``texts`` grows as chunks arrive."""

    url: str
    texts: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    enough: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"model": "tiny", "prompt": prompt(PROMPT_WORDS), "max_tokens": MAX_TOKENS,
                "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=120) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        self.done = True
                        continue
                    event: dict[str, Any] = json.loads(data)
                    self.ids.append(str(event.get("id")))
                    for choice in event.get("choices", []):
                        self.texts.append(choice.get("text") or "")
                        if choice.get("finish_reason"):
                            self.finish.append(choice["finish_reason"])
                    if len(self.texts) >= DRAIN_AFTER:
                        self.enough.set()
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.enough.set()
            self.ended.set()


@dataclass
class Worker:
    name: str
    proc: Any
    log: Path
    coordinator: Coordinator

    def saw(self, pattern: str) -> bool:
        return re.search(pattern, self.log.read_text(errors="replace")) is not None


def start_worker(
    janitor: ProcessJanitor, tmp: Path, name: str, model: Path, env: dict[str, str]
) -> Worker:
    home = tmp / name
    home.mkdir()
    coordinator = start_coordinator(janitor, home, "--grace-period", "40",
                                    "--safety-margin", "2", "--tier-timeout", "15",
                                    "--scan-interval", "0.5")
    log = home / "worker.log"
    proc = spawn_logged(
        janitor,
        [str(engine_python("dynamo")), str(WORKER), "--model-path", str(model),
         "--served-model-name", "tiny", "--discovery-backend", "file",
         "--coordinator", coordinator.url, "--delay", "0.05"],
        log, env=env,
    )
    wait_for(lambda: proc.poll() is None and coordinator.status()["workers"],
             timeout=DYNAMO_START_S, what=f"{name} registered with its coordinator")
    return Worker(name=name, proc=proc, log=log, coordinator=coordinator)


def test_draining_a_dynamo_worker_mid_stream_migrates_the_request_to_another_worker(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start Dynamo's frontend (file discovery, --migration-limit 3) and two example
       workers, each registered with its own coordinator (one coordinator per pod);
    2. warm up until the frontend has routed a request to each worker;
    3. stream a completion of 200 tokens; after 5 chunks, find the worker serving it and drain
       that worker's coordinator (GET /drain, as the kubelet's preStop hook would);
    4. the drained worker hands the request back (EngineShutdown) and its process ends
       gracefully (exit 0, nothing SIGKILLed);
    5. the other worker continues the request;
    6. the client's one stream completes: [DONE], finish_reason "length", and exactly the
       200 expected tokens in order — nothing lost, nothing repeated;
    7. draining the other worker's pod ends it gracefully too (exit 0, nothing left)."""
    env = {**LOOPBACK_ENV, "DYN_FILE_KV": str(tmp_path / "discovery"),
           "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0", "PYTHONPATH": str(ROOT),
           "DYN_LOG": "info"}
    port = free_port()
    frontend_log = tmp_path / "frontend.log"
    frontend = spawn_logged(
        janitor,
        [str(engine_python("dynamo")), "-m", "dynamo.frontend", "--discovery-backend", "file",
         "--migration-limit", "3", "--http-host", "127.0.0.1", "--http-port", str(port),
         "--router-mode", "round-robin"],
        frontend_log, env=env,
    )
    janitor.service(frontend)  # scenery: it must still stop cleanly on SIGTERM
    url = f"http://127.0.0.1:{port}"
    workers = [start_worker(janitor, tmp_path, name, tiny_model, env) for name in ("a", "b")]

    def both_served() -> bool:
        if frontend.poll() is not None:
            raise AssertionError(f"frontend exited:\n{log_tail(frontend_log)}")
        if http_ok(url + "/v1/models"):
            httpx.post(url + "/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": prompt(3), "max_tokens": 2})
        return all(w.saw("tracking request") for w in workers)

    wait_for(both_served, timeout=DYNAMO_START_S, interval=0.5,
             what=f"both workers served a request:\n{log_tail(frontend_log)}")

    stream = Stream(url)
    reader = threading.Thread(target=stream.run, daemon=True)
    reader.start()
    assert stream.enough.wait(60), "no streamed chunks"
    assert stream.error is None, stream.error
    request_id = stream.ids[0].removeprefix("cmpl-")
    serving = [w for w in workers if w.saw(f"tracking request {re.escape(request_id)}")]
    assert len(serving) == 1, (request_id, [log_tail(w.log) for w in workers])
    drained = serving[0]
    other = next(w for w in workers if w is not drained)
    drained_tree = list(tree(drained.proc.pid))

    with drained.coordinator.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert stream.ended.wait(60), "the client stream did not end"
    assert stream.error is None, stream.error

    fates = [{k: p.get(k) for k in ("pid", "name", "fate", "exit_code")}
             for p in summary["processes"]]
    print("drained Dynamo worker:", json.dumps(fates))
    print("drain summary:", json.dumps({k: v for k, v in summary.items() if k != "processes"}))
    assert summary["phase"] == "done"
    assert {p["fate"] for p in fates} <= {"exited", "gone"}, fates
    assert drained.proc.wait(timeout=30) == 0
    assert alive(drained_tree) == []
    assert drained.saw(f"handed back request {re.escape(request_id)}")
    assert other.saw(f"tracking request {re.escape(request_id)}"), log_tail(other.log)

    words = "".join(stream.texts).split()
    assert stream.done, stream.finish
    assert stream.finish == ["length"]
    assert words == expected_words(), "\n".join(words)

    # 7. the other pod is deleted too: its drain ends its worker gracefully as well.
    other_tree = list(tree(other.proc.pid))
    with other.coordinator.client(timeout=120) as client:
        assert client.get("/drain").json()["outcome"] == "graceful"
    assert other.proc.wait(timeout=60) == 0
    assert alive(other_tree) == []
