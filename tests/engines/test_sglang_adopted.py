"""The real SGLang (0.5.23, on the CPU) adopted by a coordinator with the ``sglang`` profile,
drained as the kubelet's preStop hook does it, every process's end read from strace.

What the summary says is held against what happened: each process's exit code or signal as
the kernel told strace, who sent the signals that killed (SGLang's own ``kill`` calls are
traced; a SIGKILL no traced process sent came from outside its tree), the stream as the client
received it (token ids, ``[DONE]``), and SGLang's own log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines import strace_record
from tests.engines.sglang_stack import (
    ENGINE_FLAGS,
    Trace,
    adopt,
    completion_body,
    drain,
    start_sglang,
    start_stream,
    trace_tree,
)
from tests.engines.stack import alive, pattern_for, start_coordinator
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(900),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

FITS = 200
"""Tokens of a stream that ends well inside a 30 s grace period (about 2-4 s here)."""
DOES_NOT_FIT = 16000
"""Tokens of a stream no 20 s grace period holds: SGLang streamed 8,000 in over a minute
under load here, but in under 18 s on an idle machine, which then ended it whole before the
drain's deadline. Its server gets the KV cache for it (``CUT_FLAGS``)."""
CUT_FLAGS = (*(f for f in ENGINE_FLAGS if f not in ("--max-total-tokens", "8192")),
             "--max-total-tokens", "16384")


def by_title(trace: Trace, marker: str) -> int:
    return next(pid for pid, name in trace.names.items() if marker in name)


def test_a_stream_that_fits_ends_whole_and_the_main_process_exits_0(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start SGLang (main, resource_tracker, scheduler, detokenizer) and trace every process;
    2. a coordinator with ``--engine sglang`` and a 30 s grace period adopts it;
    3. a 200-token stream is in flight; GET /drain (the kubelet's preStop hook);
    4. the stream ends whole ([DONE], every token) and the main process exits 0 (its wait
       status, as its container records it), after the coordinator's SIGTERM (strace: it
       received SIGTERM from outside its tree), and no process got SIGKILL from the
       coordinator: every SIGKILL strace saw was sent by SGLang's main process itself;
    5. the summary agrees with those records process by process, and says whose SIGKILL the
       detokenizer's and the resource tracker's were (SGLang's own, with the fix named):
       the drain is not graceful, and no request was lost."""
    sglang = start_sglang(janitor, tmp_path, tiny_model)
    trace = trace_tree(janitor, tmp_path, sglang.proc.pid, "sglang")
    main = sglang.proc.pid
    coordinator = adopt(janitor, tmp_path, tiny_model, sglang, trace, 30)
    stream = start_stream(sglang.url + "/v1/completions",
                          completion_body(sglang.model, prompt(6), FITS))
    assert stream.started.wait(timeout=300)

    summary = drain(coordinator, tmp_path, "fits")

    assert sglang.proc.wait(timeout=60) == 0
    assert stream.ended.wait(timeout=60)
    assert stream.whole, stream.error
    assert len(stream.tokens) == FITS
    record = trace.record()
    assert record.ends[main].exit_code == 0
    # One SIGTERM, from outside the tree (the coordinator); SGLang may also raise SIGPIPE in
    # itself as it closes its pipes.
    terms = [r for r in record.ends[main].received if r.signal == "SIGTERM"]
    assert len(terms) == 1, record.ends[main]
    assert terms[0].sender not in trace.names, terms
    # Processes only (strace also reports each thread's end under its own id).
    killed = {pid: record.ends[pid] for pid in trace.names
              if record.ends[pid].killed_by == "SIGKILL"}
    assert killed, "SGLang 0.5.23 SIGKILLs its detokenizer at every shutdown"
    for pid in killed:
        assert record.senders_of(pid, "SIGKILL") == [main], (pid, record.sent)
    processes = {p["pid"]: p for p in summary["processes"]}
    assert set(trace.names) <= set(processes)
    for pid in trace.names:
        assert processes[pid]["exit_code"] == record.ends[pid].wait_status, processes[pid]
        assert processes[pid]["killed_at"] is None, processes[pid]
    assert processes[main]["fate"] == "exited"
    assert processes[main]["tier"] == "sglang-root"
    detokenizer = by_title(trace, "sglang::detokenizer")
    assert detokenizer in killed
    assert summary["outcome"] == "signalled"
    assert summary["drain"]["lost_requests"] == 0
    assert summary["drain"]["cut_requests"] == 0
    causes = " ".join(summary["drain"]["causes"])
    assert "a SIGKILL sent by the engine itself, not by the coordinator" in causes
    assert "drainable integration" in causes
    assert alive(list(trace.names)) == []


def test_a_stream_that_does_not_fit_is_cut_and_counted(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. as above with a 20 s grace period and an 8000-token stream (longer than the budget);
    2. GET /drain: the probe holds the migration window while SGLang counts the stream, then
       the main process gets SIGTERM and serves the stream on (its SIGTERM drain has no
       bound) until the coordinator's SIGKILL, not before the drain's deadline less the
       kill's confirmation reserve;
    3. ground truth: the main process's wait status is -9 (its container says 137), SGLang's
       own log has no kill_process_tree (the SIGKILL was not its own), the client's stream
       ended without [DONE] and short of its tokens, and nothing of the tree is left;
    4. the summary counts the cut request (``cut_requests`` 1, in ``lost_requests``), its
       outcome is ``killed`` and its causes say a request was cut.

    Not traced: a SIGKILLed process that strace holds ends only as fast as strace reaps its
    many threads, seconds on a loaded machine, which would make the kill's confirmation,
    not SGLang, the subject."""
    sglang = start_sglang(janitor, tmp_path, tiny_model, engine_flags=CUT_FLAGS)
    main = sglang.proc.pid
    names = sglang.names()
    coordinator = start_coordinator(
        janitor, tmp_path, "--engine", "sglang", "--grace-period", "20",
        "--adopt-pattern", f"sglang\\.launch_server .*{pattern_for(tiny_model)}",
        "--engine-metrics-url", sglang.url + "/metrics", "--scan-interval", "0.5")
    wait_for(lambda: set(names) <= {p["pid"] for p in coordinator.status()["processes"]},
             timeout=60, what="the coordinator lists the whole SGLang tree")
    stream = start_stream(sglang.url + "/v1/completions",
                          completion_body(sglang.model, prompt(6), DOES_NOT_FIT))
    assert stream.started.wait(timeout=300)

    summary = drain(coordinator, tmp_path, "cut")

    assert sglang.proc.wait(timeout=60) == -9
    assert stream.ended.wait(timeout=60)
    assert not stream.done
    assert len(stream.tokens) < DOES_NOT_FIT
    assert "kill_process_tree called" not in sglang.log.read_text(errors="replace")
    processes = {p["pid"]: p for p in summary["processes"]}
    root = processes[main]
    assert root["fate"] == "killed"
    assert root["signal"] == "SIGTERM"
    confirm_s = 2.0
    assert root["kill_at"] >= summary["drain"]["deadline_at"] - confirm_s - 0.5, (
        root, summary["drain"])
    assert summary["drain"]["cut_requests"] == 1
    assert summary["drain"]["lost_requests"] >= 1
    assert summary["outcome"] == "killed"
    assert any("cut by the kill" in cause for cause in summary["drain"]["causes"])
    wait_for(lambda: alive(list(names)) == [], timeout=60, what="the tree gone")
