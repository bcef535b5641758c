"""vLLM's AsyncLLM behind the example server built on worker_client: a drain hands the
stream back, aborts it in the engine, and ends the tree in vLLM's own order."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines.stack import ROOT, alive, start_coordinator, start_vllm, tree
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

SERVER = ROOT / "deploy" / "examples" / "vllm" / "drainable_server.py"
MAX_TOKENS = 16000
"""Long enough that the stream is still running when the drain lands: the tiny model makes
about a token per millisecond here, so this is several seconds, against the milliseconds the
drain notice takes."""
# The drain starts as soon as the response headers arrive, not after some tokens: on a loaded
# 2-core machine the client may read the first event only once the tiny model has produced
# them all (the events then arrive in one burst), so waiting for events would race the end of
# the generation. The headers come when the server starts the generation, which then runs for
# seconds.
ESCALATIONS = ("died unexpectedly", "force killing")


@dataclass
class Stream:
    """A streaming completion read in a thread."""

    url: str
    request_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"prompt": prompt(6), "max_tokens": MAX_TOKENS, "ignore_eos": True,
                "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120,
                              headers={"X-Request-Id": self.request_id}) as response:
                response.raise_for_status()
                self.started.set()
                # Bytes only while the stream runs: parsing each event here would hold the
                # GIL against the test thread's drain call (see _drain_now).
                raw = b"".join(response.iter_bytes())
            for line in raw.decode().splitlines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    self.done = True
                    continue
                self.events.append(json.loads(data))
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.started.set()
            self.ended.set()


def _drain_now(client: httpx.Client) -> None:
    """POST /drain (no wait) on ``client``'s open keep-alive connection."""
    assert client.post("/drain", json={"wait": False, "reason": "test"}).status_code == 202


def test_a_drain_hands_the_vllm_stream_back_and_stops_the_tree_in_vllms_order(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start a coordinator, then the example server (AsyncLLM on the tiny dummy Llama)
       pointed at it; it registers with vLLM's tiers;
    2. stream a 16000-token completion; once its response has started, start a drain
       (POST /drain, no wait);
    3. the stream ends with a handed_back event naming the request and the tokens streamed
       (fewer than asked: the events before it), and no [DONE]; the server logs the hand-back;
    4. the handoff is in /status migrations; acknowledge it as a router would;
    5. GET /drain joins the drain: EngineCore went first (its tier), every process exited
       after SIGTERM, the server with 0, vLLM logged no escalation; nothing is left."""
    coordinator = start_coordinator(
        janitor, tmp_path, "--grace-period", "90", "--safety-margin", "5",
        "--tier-timeout", "20", "--scan-interval", "0.5",
    )
    vllm = start_vllm(janitor, tmp_path, tiny_model, max_model_len=16384,
                      argv=[str(SERVER), "--coordinator", coordinator.url])
    wait_for(lambda: [w["pid"] for w in coordinator.status()["workers"]] == [vllm.proc.pid],
             timeout=60, what="the server registered")
    before = tree(vllm.proc.pid)

    # Connected before the stream starts: with the stream's reader thread busy in this
    # process, every GIL hand-off of the drain call can wait 5 ms (the switch interval); a
    # fresh client (TLS context, connect) once took 12 s, longer than the whole generation.
    with coordinator.client() as drainer:
        assert drainer.get("/healthz").status_code == 200
        stream = Stream(vllm.url, "rid-drain-1")
        reader = threading.Thread(target=stream.run, daemon=True)
        reader.start()
        assert stream.started.wait(120), "the response did not start"
        assert stream.error is None, stream.error
        _drain_now(drainer)
    assert stream.ended.wait(60), "the stream did not end"
    assert stream.error is None, stream.error

    last = stream.events[-1]
    assert last.get("handed_back") is True, (len(stream.events), last, coordinator.status())
    assert last["request_id"] == "rid-drain-1"
    assert 0 <= last["tokens"] < MAX_TOKENS
    assert not stream.done
    streamed = sum(1 for e in stream.events if "choices" in e)
    assert streamed <= last["tokens"]
    log_text = vllm.log.read_text(errors="replace")
    assert "handed back request rid-drain-1" in log_text

    migrations = wait_for(lambda: coordinator.status()["migrations"], timeout=30,
                          what="the handoff reported")
    assert [(m["request_id"], m["tokens"]) for m in migrations] == [
        ("rid-drain-1", last["tokens"])]
    with coordinator.client() as client:
        acked = client.post("/migrations/ack", json={"request_ids": ["rid-drain-1"]}).json()
        assert acked["acked"] == ["rid-drain-1"]
        summary = client.get("/drain", timeout=180).json()

    report = [{k: p.get(k) for k in ("pid", "name", "fate", "exit_code", "elapsed_ms", "tier")}
              for p in summary["processes"]]
    print("vLLM with worker_client:", json.dumps(report, indent=1))
    assert summary["phase"] == "done"
    assert set(before) <= {p["pid"] for p in report}
    assert {p["fate"] for p in report} == {"exited"}, report
    engine_core = next(p for p in report if p["name"].startswith("VLLM::EngineCor"))
    assert engine_core["tier"] == "engine-core"
    assert vllm.proc.wait(timeout=30) == 0
    log_text = vllm.log.read_text(errors="replace")
    assert not [m for m in ESCALATIONS if m in log_text]
    assert alive(list(before)) == []
