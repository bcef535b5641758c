"""How soon a stock engine's pod is empty with a long stream in flight: waited for, or
ended by the drain and continued on a peer through the proxy (``--end-streams``).

    .venv/bin/python -m bench.stock_ending [--engines sglang vllm] [--tokens 3000]
        [--runs 1] [--json FILE]

Needs ``scripts/engines.sh sglang vllm routers``. Per engine, one peer of the same kind and
vllm-router in front of it for the whole run; per row a fresh stock engine (the drained one),
adopted by a coordinator with the engine's profile (``--grace-period 120``), added to the
router by the coordinator's join, the continuation proxy in front of the router watching that
coordinator, and one greedy stream of ``--tokens`` tokens (3,000: still in flight when a
loaded machine's drain has taken the pod out; vLLM streams about 90 a second) through the
proxy, sent while the peer is out of the router so it lands on the drained engine. Once the
stream has 10 chunks, the kubelet's ``GET /drain``, then its SIGTERM to the engine's main
process if it still runs:

- ``wait``: the coordinator without ``--end-streams``: its probe holds the migration until the
  stream ends on the drained engine;
- ``end``: with ``--end-streams``: the drain aborts the stream through the engine's own call
  and the proxy continues it on the peer.

Per row: the time from ``GET /drain`` to the last process of the drained engine's tree gone
(the pod empty), the stream as the client got it (its token ids against the peer's whole
generation, ``[DONE]``), and the summary's ended / continued / cut / lost. The ratio of the
two rows' times is printed per engine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from devstack import routers
from tests.continuation.stack import start_proxy
from tests.engines.sglang_stack import completion_body, start_stream
from tests.engines.stack import start_coordinator
from tests.engines.stock_stack import STARTERS, Server
from tests.engines.tiny_model import prompt, write_tiny_model
from tests.routers.stack import janitor_spawn
from tests.support.processes import ProcessJanitor, wait_for

ROUTER = "vllm-router"
STARTED_CHUNKS = 10


@dataclass
class Row:
    engine: str
    mode: str
    empty_s: float
    """``GET /drain`` to the drained engine's last process gone."""
    stream_s: float
    """``GET /drain`` to the client's ``[DONE]``."""
    whole: bool
    exact: bool
    ended: int
    continued: int
    cut: int
    lost: int
    outcome: str


def tree_pids(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def run_row(engine: str, mode: str, tokens: int, janitor: ProcessJanitor, tmp: Path,
            model: Path, peer: Server, front: routers.RouterProcess,
            expected: list[int]) -> Row:
    drained = STARTERS[engine](janitor, tmp, model, f"drained-{mode}")
    ending = ["--end-streams"] if mode == "end" else []
    coordinator = start_coordinator(
        janitor, tmp, "--engine", engine, *ending, "--grace-period", "120",
        "--adopt-pattern", drained.pattern, "--engine-url", drained.url,
        "--engine-metrics-url", drained.url + "/metrics", "--scan-interval", "0.5",
        "--router", f"{ROUTER}={front.url}", "--router-worker-url", drained.url)
    wait_for(lambda: front.routes_to(drained.url), timeout=120, what="routed to the drained")
    proxy = start_proxy(janitor, tmp, front.url, "--coordinator", coordinator.url)
    processes = tree_pids(drained.pid)
    front.remove_worker(peer.url)
    body = {**completion_body(peer.model, prompt(6), tokens), "stream": True}
    stream = start_stream(proxy.url + "/v1/completions", body, {"X-Request-Id": mode})
    wait_for(lambda: stream.chunks >= STARTED_CHUNKS or stream.ended.is_set(), timeout=300,
             what="the stream under way")
    front.add_worker(peer.url)
    started = time.monotonic()
    with coordinator.client(timeout=300) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    with_main = psutil.pid_exists(drained.pid)
    if with_main:  # the kubelet's SIGTERM once the hook returned
        os.kill(drained.pid, signal.SIGTERM)
    psutil.wait_procs(processes, timeout=120)
    empty_s = time.monotonic() - started
    stream.ended.wait(timeout=300)
    stream_s = time.monotonic() - started
    drain = summary.get("drain") or summary.get("last_drain") or {}
    front.remove_worker(drained.url)
    return Row(engine, mode, round(empty_s, 2), round(stream_s, 2), stream.whole,
               stream.tokens == expected, drain.get("ended_requests", 0),
               drain.get("continued_requests", 0), drain.get("cut_requests", 0),
               drain.get("lost_requests", 0), str(summary.get("outcome")))


def run_engine(engine: str, tokens: int, runs: int, tmp: Path, model: Path) -> list[Row]:
    janitor = ProcessJanitor()
    rows: list[Row] = []
    try:
        peer = STARTERS[engine](janitor, tmp, model, "peer")
        body = completion_body(peer.model, prompt(6), tokens)
        expected = httpx.post(peer.url + "/v1/completions", json=body,
                              timeout=600).json()["choices"][0]["token_ids"]
        front = routers.start_router(ROUTER, janitor_spawn(janitor), tmp, [peer.url])
        for run in range(runs):
            for mode in ("wait", "end"):
                row_tmp = tmp / f"{engine}-{mode}-{run}"
                row_tmp.mkdir(parents=True)
                rows.append(run_row(engine, mode, tokens, janitor, row_tmp, model, peer,
                                    front, expected))
                print(json.dumps(asdict(rows[-1])), flush=True)
    finally:
        janitor.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["sglang", "vllm"])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stock-ending-"))
    model = write_tiny_model(tmp / "model")
    rows: list[Row] = []
    for engine in args.engines:
        rows += run_engine(engine, args.tokens, args.runs, tmp / engine, model)
    print("\n| engine | mode | pod empty (s) | client's [DONE] (s) | whole, exact | ended / "
          "continued / cut / lost | outcome |\n| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row.engine} | {row.mode} | {row.empty_s} | {row.stream_s} | "
              f"{row.whole}, {row.exact} | {row.ended} / {row.continued} / {row.cut} / "
              f"{row.lost} | {row.outcome} |")
    for engine in args.engines:
        wait = [r.empty_s for r in rows if r.engine == engine and r.mode == "wait"]
        end = [r.empty_s for r in rows if r.engine == engine and r.mode == "end"]
        if wait and end:
            print(f"{engine}: pod empty {statistics.median(wait) / statistics.median(end):.1f}x "
                  f"sooner ended than waited for (medians {statistics.median(end)} s vs "
                  f"{statistics.median(wait)} s)")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
