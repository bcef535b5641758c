"""How a real SGLang pod ends, each process read from its own record: with a plain SIGTERM,
adopted by the coordinator with the ``sglang`` profile, and as the drainable integration.

    .venv/bin/python -m bench.sglang_shutdown [--grace 30 120] [--tokens 400 2000]
        [--modes kubelet scheduler-first adopted adopted-generic adopted-before drainable]
        [--before DIR]
        [--keep DIR] [--json FILE]

Needs ``scripts/engines.sh sglang`` and strace. Each row starts a fresh SGLang 0.5.23 (the tiny
Llama with dummy weights, on the CPU), attaches strace to every process of its tree
(``tests/engines/strace_record.py``), opens one greedy stream of ``--tokens`` tokens, waits
for its first chunk, and ends the pod as Kubernetes would with a grace period of ``--grace``
seconds:

- ``kubelet``: SIGTERM to the main process (the container's PID 1 without a sidecar), and at
  the end of the grace period SIGKILL to whatever is left (the kubelet's);
- ``scheduler-first``: SIGTERM to the scheduler, as a children-first order would send it;
- ``adopted``: the coordinator (``serve --engine sglang --grace-period G``, the engine's
  ``/metrics`` as its in-flight probe, adopting this SGLang by pattern) drained by the
  kubelet's ``GET /drain`` (its preStop hook), then the kubelet's SIGTERM to the main process
  if it still runs, then SIGKILL at the end of the grace period; ``adopted-before``: the same
  with the coordinator of the checkout ``--before`` names (an earlier commit, for the
  before → after rows); ``adopted-generic``: the same coordinator without the profile
  (``--engine generic``, what an adopter that knows nothing of SGLang does): the default
  order, children before parents, deepest first, the main process last;
- ``drainable``: ``deploy/examples/sglang/drainable_server.py`` (SGLang's own server with
  ``worker_client`` inside) registered with its coordinator, behind vllm-router beside a
  second real SGLang (one for the whole run), the continuation proxy in front of the router:
  two streams through the proxy (round robin puts one on each server; the row follows the
  one the drained server handed back, by its log), the same ``GET /drain``, kubelet SIGTERM
  and SIGKILL; the stream is held against the token ids the second server generates whole.

Per process: how it ended (exit code, or the signal) and who sent that signal, from strace
(``SGLang``: its own main process; ``kubelet``: the bench at the end of the grace period;
``coordinator``: the coordinator's SIGKILL, as its summary says and strace confirms: no traced
process sent it). The main process's code as its container would record it (a death by signal
N is 128 + N). The stream as the client received it: its tokens and whether ``[DONE]`` came.
The time from the stop (SIGTERM or ``GET /drain``) to the main process's exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.engines import strace_record
from tests.engines.sglang_stack import (
    Sglang,
    completion_body,
    start_drainable_pod,
    start_sglang,
    start_stream,
    trace_tree,
)
from tests.engines.stack import ROOT, pattern_for, start_coordinator
from tests.engines.tiny_model import prompt, write_tiny_model
from tests.support.processes import ProcessJanitor, wait_for

ROLES = (("sglang::scheduler", "scheduler"), ("sglang::detokenizer", "detokenizer"),
         ("resource_tracker", "resource_tracker"), ("data_parallel", "dp-controller"))


@dataclass
class Row:
    mode: str
    grace_s: float
    tokens: int
    ends: dict[str, str] = field(default_factory=dict)
    """Role → how it ended and who sent its signal."""
    main_container: int | None = None
    stream: str = ""
    outcome: str = "-"
    lost: str = "-"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def role(name: str, main: int, pid: int) -> str:
    if pid == main:
        return "main"
    for marker, label in ROLES:
        if marker in name:
            return label
    return name


def port_of(sglang: Sglang) -> int:
    return int(sglang.url.rsplit(":", 1)[1])


def container_code(status: int | None) -> int | None:
    if status is None:
        return None
    return 128 - status if status < 0 else status


def who(record: strace_record.Record, pid: int, main: int, *, kubelet: set[int],
        coordinator_killed: set[int], coordinator: int | None = None) -> str:
    end = record.ends.get(pid)
    if end is None:
        return "not seen"
    if end.killed_by is None:
        return end.describe()
    senders = record.senders_of(pid, end.killed_by)
    if senders:
        by = "SGLang" if main in senders else "its engine"
    elif pid in kubelet:
        by = "kubelet"
    elif pid in coordinator_killed:
        by = "coordinator"
    else:
        received = [r for r in end.received if r.signal == end.killed_by]
        sender = received[-1].sender if received else None
        by = ("coordinator" if sender is not None and sender == coordinator
              else str(sender) if sender else "outside")
    return f"{end.killed_by} ({by})"


def end_pod(sglang: Sglang, names: dict[int, str], deadline: float) -> set[int]:
    """Wait until the grace period is over or the tree is gone; SIGKILL what is left (the
    kubelet's); return the PIDs it SIGKILLed."""
    procs = []
    for pid in names:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, left = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
    killed = set()
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()
                killed.add(proc.pid)
    return killed


def run_row(mode: str, grace_s: float, tokens: int, janitor: ProcessJanitor, tmp: Path,
            model: Path, peer: Sglang | None, before: Path | None) -> Row:
    row = Row(mode, grace_s, tokens)
    tmp.mkdir(parents=True)
    coordinator = None
    url = ""
    names: list[str] = []
    if mode == "drainable":
        assert peer is not None
        pod = start_drainable_pod(janitor, tmp, model, peer, grace_s)
        sglang, coordinator, url = pod.drained, pod.coordinator, pod.proxy_url
    else:
        sglang = start_sglang(janitor, tmp, model)
        url = sglang.url
    main = sglang.proc.pid
    trace = trace_tree(janitor, tmp, main, "pod")
    if mode.startswith("adopted"):
        profile = "generic" if mode == "adopted-generic" else "sglang"
        coordinator = start_coordinator(
            janitor, tmp, "--engine", profile, "--grace-period", f"{grace_s:g}",
            # Its port too: the drainable rows' second SGLang runs the same model, and a
            # coordinator that adopted it would stop it with this pod.
            "--adopt-pattern",
            f"sglang\\.launch_server .*{pattern_for(model)} .*--port {port_of(sglang)}(\\s|$)",
            "--engine-metrics-url", sglang.url + "/metrics", "--scan-interval", "0.5",
            source=before if mode == "adopted-before" and before else ROOT)
        wait_for(lambda: set(trace.names) <= {p["pid"] for p in coordinator.status()["processes"]},
                 timeout=60, what="the coordinator lists the SGLang tree")
    body = completion_body(sglang.model, prompt(6), tokens)
    # Through the proxy and smg (round robin over the two servers), two streams: one of them
    # is on the drained server; the row follows that one (its log names it).
    names = ["s1", "s2"] if mode == "drainable" else ["s1"]
    streams = {}
    for name in names:
        streams[name] = start_stream(url + "/v1/completions", body, {"X-Request-Id": name})
        streams[name].started.wait(timeout=300)
    started = time.monotonic()
    deadline = started + grace_s
    summary: dict[str, Any] = {}
    if mode == "scheduler-first":
        scheduler = next(pid for pid, name in trace.names.items() if "sglang::scheduler" in name)
        psutil.Process(scheduler).send_signal(signal.SIGTERM)
    elif coordinator is None:
        sglang.proc.send_signal(signal.SIGTERM)
    else:
        with coordinator.client(timeout=grace_s + 60) as client:
            summary = client.get("/drain").json()
        if sglang.proc.poll() is None:
            sglang.proc.send_signal(signal.SIGTERM)  # the kubelet's, once preStop returned
            row.notes.append(f"kubelet SIGTERM {time.monotonic() - started:.1f} s in")
    kubelet = end_pod(sglang, trace.names, deadline)
    status = sglang.proc.wait(timeout=60)
    row.seconds = time.monotonic() - started
    row.main_container = container_code(status)
    record = trace.record()
    killed = {p["pid"] for p in summary.get("processes", ()) if p.get("killed_at")}
    for pid, name in trace.names.items():
        row.ends[role(name, main, pid)] = who(
            record, pid, main, kubelet=kubelet, coordinator_killed=killed,
            coordinator=coordinator.proc.pid if coordinator is not None else None)
    handed = [n for n in names if f"handed back request {n}." in sglang.log.read_text(
        errors="replace")]
    followed = streams[handed[0] if handed else names[0]]
    followed.ended.wait(timeout=300)
    got = len(followed.tokens)
    whole = followed.done and got == tokens
    row.stream = f"{'whole' if whole else 'cut'} {got}/{tokens}"
    if peer is not None and handed:
        exact = followed.tokens == expected_ids(peer, body)
        row.stream += f", handed back, {'token-exact' if exact else 'NOT token-exact'}"
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1))
    if summary:
        row.outcome = str(summary.get("outcome"))
        drained = summary.get("drain") or {}
        row.lost = f"{drained.get('lost_requests')} (cut {drained.get('cut_requests', '-')})"
        row.notes += list(drained.get("causes") or ())
    return row


_EXPECTED: dict[str, list[int]] = {}


def expected_ids(peer: Sglang, body: dict[str, Any]) -> list[int]:
    """The token ids the peer generates for ``body`` in one piece (greedy: the same as any
    server with the same dummy weights)."""
    key = json.dumps(body, sort_keys=True)
    if key not in _EXPECTED:
        answer = httpx.post(peer.url + "/v1/completions", json=body, timeout=900).json()
        _EXPECTED[key] = list(answer["choices"][0]["token_ids"])
    return _EXPECTED[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--grace", type=float, nargs="+", default=[30.0, 120.0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[400, 2000])
    parser.add_argument("--modes", nargs="+", default=["kubelet", "adopted", "drainable"])
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep every log and strace record under this directory")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout whose coordinator runs the 'adopted-before' rows "
                             "(e.g. git archive of an earlier commit)")
    args = parser.parse_args()
    if not strace_record.available():
        sys.exit("strace is not installed (apt-get install strace)")
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sglang-")))
        else:
            tmp = args.keep
            tmp.mkdir(parents=True, exist_ok=True)
        model = write_tiny_model(tmp / "model")
        peer = None
        if "drainable" in args.modes:
            # The second SGLang the drained server's streams continue on: one for every row.
            peers = ProcessJanitor()
            stack.callback(peers.close)
            (tmp / "peer").mkdir()
            peer = start_sglang(peers, tmp / "peer", model)
        for grace in args.grace:
            for tokens in args.tokens:
                for mode in args.modes:
                    janitor = ProcessJanitor()
                    try:
                        row = run_row(mode, grace, tokens, janitor,
                                      tmp / f"{mode}-{grace:g}-{tokens}", model, peer,
                                      args.before)
                    finally:
                        janitor.close()
                    rows.append(row)
                    print(json.dumps(row.__dict__), flush=True)
    print()
    print(f"{'row':40} {'main':>9} {'scheduler':>18} {'detokenizer':>18} "
          f"{'resource_tracker':>18} {'stream':>14} {'outcome':>14} {'lost':>10} {'s':>6}")
    for r in rows:
        name = f"{r.mode}, grace {r.grace_s:g} s, {r.tokens} tok"
        main_end = r.ends.get("main", "?")
        print(f"{name:40} {main_end + ' ' + str(r.main_container):>9} "
              f"{r.ends.get('scheduler', '-'):>18} {r.ends.get('detokenizer', '-'):>18} "
              f"{r.ends.get('resource_tracker', '-'):>18} {r.stream:>14} {r.outcome:>14} "
              f"{r.lost:>10} {r.seconds:6.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))


if __name__ == "__main__":
    main()
