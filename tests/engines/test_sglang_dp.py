"""The real SGLang (0.5.23, on the CPU) with ``--dp-size 2``: a data-parallel controller
between the main process and its two schedulers, which are the controller's children and die
with it (``PR_SET_PDEATHSIG=SIGKILL``). Drained adopted with the ``sglang`` profile, and as the
drainable integration, every process's end read from strace.

Tree: main (tokenizer manager + uvicorn) → the multiprocessing resource tracker,
``sglang::data_parallel_controller`` → ``sglang::scheduler_DP0``, ``_DP1``; and
``sglang::detokenizer``. SGLang's CPU path refuses more data-parallel ranks than NUMA nodes
unless each rank is bound to its own cores (``SGLANG_CPU_OMP_THREADS_BIND``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engines import strace_record
from tests.engines.sglang_stack import (
    DRAINABLE,
    Sglang,
    Trace,
    adopt,
    assert_sglang_stopped_itself,
    completion_body,
    drain,
    start_sglang,
    start_stream,
    trace_tree,
)
from tests.engines.stack import alive, start_coordinator
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(1200),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

DP_FLAGS = ("--dp-size", "2")
DP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
"""One core a rank (the CPU path's NUMA check refuses two ranks on one node without it)."""
TOKENS = 200
"""A stream that ends well inside the migration window of a 60 s grace period."""


def start_dp(janitor: ProcessJanitor, tmp: Path, model: Path, **kwargs: Any) -> Sglang:
    return start_sglang(janitor, tmp, model, flags=[*DP_FLAGS, *kwargs.pop("flags", ())],
                        env=DP_ENV, **kwargs)


def roles(trace: Trace) -> dict[str, list[int]]:
    """Role → PIDs, from each process's title (``sglang::scheduler_DP0`` → ``scheduler``)."""
    out: dict[str, list[int]] = {}
    for pid, name in trace.names.items():
        role = ("controller" if "data_parallel_controller" in name
                else "scheduler" if "sglang::scheduler" in name
                else "detokenizer" if "sglang::detokenizer" in name
                else "resource_tracker" if "resource_tracker" in name
                else "main")
        out.setdefault(role, []).append(pid)
    return out


def assert_the_dp_shape(trace: Trace, main: int) -> dict[str, list[int]]:
    """The tree as SGLang builds it: two schedulers under the controller, which is the main
    process's child (their parents from /proc, read by ``trace_tree``'s listing)."""
    found = roles(trace)
    assert len(found.get("controller", ())) == 1, trace.names
    assert len(found.get("scheduler", ())) == 2, trace.names
    assert found["main"] == [main], trace.names
    return found


def test_dp_adopted_the_schedulers_leave_on_shutdownreq_before_their_controller_is_killed(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. SGLang with ``--dp-size 2`` (main, tracker, DP controller, two schedulers, the
    detokenizer), strace on every process; a coordinator with ``--engine sglang`` and a 60 s
    grace period adopts it; a 200-token stream is in flight;
    2. GET /drain (the kubelet's preStop hook): the probe holds the migration while SGLang
    counts the stream, then the main process alone gets SIGTERM and stops its engine itself;
    3. ground truth: the stream whole; the main process exits 0 after one SIGTERM from outside
    its tree; every SIGKILL strace saw was sent by the main process's own ``kill`` calls (SGLang's
    ``kill_process_tree``): none by the coordinator, none by a PDEATHSIG (a scheduler whose
    controller died under it would have no sender); each scheduler that exited did so with 0;
    4. the summary agrees with strace process by process, names the engine's own SIGKILL with
    the fix, and loses nothing."""
    sglang = start_dp(janitor, tmp_path, tiny_model)
    main = sglang.proc.pid
    trace = trace_tree(janitor, tmp_path, main, "sglang-dp")
    found = assert_the_dp_shape(trace, main)
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
    assert found["controller"][0] in killed, "SGLang 0.5.23 SIGKILLs its DP controller"
    for pid in found["scheduler"]:
        end = record.ends[pid]
        assert end.killed_by == "SIGKILL" or end.exit_code == 0, (trace.names[pid], end)
    assert alive(list(trace.names)) == []


def test_dp_drainable_every_process_exits_0_and_the_stream_is_handed_back(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. the drainable server with ``--dp-size 2``, registered with its coordinator (90 s
    grace period), strace on every process; a 2000-token stream in flight on it;
    2. GET /drain: the server hands the stream back mid-way (the client's stream ends with the
    ``handed_back`` event, its log says so), then stops its engine in order: ``ShutdownReq``
    (through the DP controller, both schedulers leave their loop), SIGTERM to the controller
    and to the detokenizer;
    3. strace: every process of the tree exits 0 (the main process, the controller, both
    schedulers, the detokenizer, the resource tracker), none died of a signal, no process of
    the tree sent a SIGKILL; each controller and detokenizer ran its exit cleanup (its own
    line in the server's log, not the forced exit);
    4. the summary: nothing of the tree is a cause; the one request lost is the handed-back
    stream, which nobody acknowledged (no router here re-issues it: continuing it on a second
    SGLang is ``test_sglang_drainable.py``'s), and nothing was cut."""
    # No router acknowledges the handed-back stream, so its wait takes the whole migration
    # share: the termination share left (0.4 of the budget) must hold the engine's ordered
    # stop and its interpreter's teardown, 20+ s on a loaded 2-core machine (at 60 s the
    # main process was SIGKILLed 4 s into its teardown).
    coordinator = start_coordinator(janitor, tmp_path, "--grace-period", "90")
    sglang = start_dp(janitor, tmp_path, tiny_model, argv=DRAINABLE,
                      flags=["--coordinator", coordinator.url])
    main = sglang.proc.pid
    wait_for(lambda: [w["pid"] for w in coordinator.status()["workers"]] == [main],
             timeout=60, what="the drainable server registered")
    trace = trace_tree(janitor, tmp_path, main, "drainable-dp")
    assert_the_dp_shape(trace, main)
    stream = start_stream(sglang.url + "/v1/completions",
                          completion_body(sglang.model, prompt(6), 2000),
                          {"X-Request-Id": "dp-1"})
    assert stream.started.wait(timeout=300)

    summary = drain(coordinator, tmp_path, "summary")

    assert stream.ended.wait(timeout=60)
    assert stream.handed_back is not None, stream
    assert 0 < len(stream.tokens) < 2000
    assert sglang.proc.wait(timeout=120) == 0
    log = sglang.log.read_text(errors="replace")
    assert "handed back request dp-1 after" in log
    record = trace.record()
    for pid, name in trace.names.items():
        assert record.ends[pid].exit_code == 0, (name, record.ends[pid])
    assert not [call for calls in record.sent.values() for call in calls
                if call.signal == "SIGKILL"], record.sent
    assert log.count("left its loop on SIGTERM; exit cleanup ran") == 2, log[-3000:]
    assert "forced exit" not in log
    drained = summary["drain"]
    assert summary["outcome"] == "lost_requests", drained
    assert (drained["lost_requests"], drained["cut_requests"]) == (1, 0), drained
    assert len(drained["causes"]) == 1, drained["causes"]
    assert "1 handed-back request expired unacknowledged" in drained["causes"][0]
    processes = {p["pid"]: p for p in summary["processes"]}
    assert processes[main]["tier"] == "sglang-main"
    assert {processes[pid]["exit_code"] for pid in trace.names} <= {0, None}
    assert alive(list(trace.names)) == []
