"""The real SGLang (0.5.23, on the CPU) with ``--tp 2``: two tensor-parallel schedulers
(``sglang::scheduler_TP0``, ``_TP1``, gloo between them) under the main process, drained
adopted with the ``sglang`` profile, every process's end read from strace.

Tree: main (tokenizer manager + uvicorn) → the multiprocessing resource tracker, both
schedulers, ``sglang::detokenizer``. One core a rank (``SGLANG_CPU_OMP_THREADS_BIND``), as
for ``--dp-size 2``. SGLang's ``/health`` runs a one-token generation and marks the server
unhealthy when it takes longer than ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s); the first one
compiles the model's kernels on both ranks, which took over 20 s on a loaded machine, and an
unhealthy SGLang takes another shutdown path (docs/engines.md). The bound is raised here:
this test is about the shutdown of a healthy tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines import strace_record
from tests.engines.sglang_stack import (
    adopt,
    assert_sglang_stopped_itself,
    completion_body,
    drain,
    start_sglang,
    start_stream,
    trace_tree,
)
from tests.engines.stack import alive
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(1200),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_HEALTH_CHECK_TIMEOUT": "300"}
TOKENS = 200


def test_tp_adopted_both_ranks_exit_0_and_the_main_process_exits_0(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. SGLang with ``--tp 2``, strace on every process; a coordinator with ``--engine
    sglang`` and a 60 s grace period adopts it; a 200-token stream is in flight;
    2. GET /drain: the probe holds the migration while SGLang counts the stream, then the
    main process alone gets SIGTERM and stops its engine itself;
    3. ground truth: the stream whole; the main process exits 0 after one SIGTERM from
    outside its tree; both schedulers exit 0 (``ShutdownReq``); every SIGKILL strace saw was
    sent by the main process's own ``kill`` calls (SGLang's ``kill_process_tree``);
    4. the summary agrees with strace process by process, names the engine's own SIGKILL
    with the fix, and loses nothing."""
    sglang = start_sglang(janitor, tmp_path, tiny_model, flags=["--tp", "2"], env=TP_ENV)
    main = sglang.proc.pid
    trace = trace_tree(janitor, tmp_path, main, "sglang-tp")
    schedulers = [pid for pid, name in trace.names.items() if "sglang::scheduler_TP" in name]
    assert len(schedulers) == 2, trace.names
    coordinator = adopt(janitor, tmp_path, tiny_model, sglang, trace, 60)
    stream = start_stream(sglang.url + "/v1/completions",
                          completion_body(sglang.model, prompt(6), TOKENS))
    assert stream.started.wait(timeout=300)

    summary = drain(coordinator, tmp_path, "summary")

    assert sglang.proc.wait(timeout=120) == 0
    assert stream.ended.wait(timeout=60)
    assert stream.whole, stream.error
    assert len(stream.tokens) == TOKENS
    record, killed = assert_sglang_stopped_itself(summary, trace, main)
    assert killed, "SGLang 0.5.23 SIGKILLs its detokenizer at every shutdown"
    for pid in schedulers:
        assert record.ends[pid].exit_code == 0, (trace.names[pid], record.ends[pid])
    assert alive(list(trace.names)) == []
