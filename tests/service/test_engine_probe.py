"""An adopted engine's in-flight requests, read from its own metrics, hold the migrating
phase until they are done; an endpoint that cannot be read does not hold the drain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.service.engine_probe import MAX_BODY_BYTES, inflight
from coordinator.service.render import progress_line, status_text
from coordinator.settings import DEFAULT_INFLIGHT_METRICS
from tests.service.metrics_engine import PAGE
from tests.service.servers import FAST, ROOT, Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

VLLM = ("vllm:num_requests_running", "vllm:num_requests_waiting")
GRACEFUL = [*FAST, "--grace-period", "120", "--tier-timeout", "60"]
"""FAST, with a tier the stand-in engine's exit fits on a loaded machine: these tests mean a
graceful end. Its exit takes a moment on an idle machine, but under a load average of 20-29
one took over FAST's 2 s and was SIGKILLed ("still running 2s after SIGTERM"); the kill ends
at its exit event, so the long timeout costs nothing when it is quick. The probe holds no
migration window in these tests, so the long grace period costs nothing either."""

SGLANG_PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} NaN
"""


def test_the_count_is_the_sum_of_the_named_gauges_over_every_label_set() -> None:
    assert inflight(PAGE.format(running=3, waiting=2), VLLM) == 5
    assert inflight(PAGE.format(running=0, waiting=0), DEFAULT_INFLIGHT_METRICS) == 0
    assert inflight(SGLANG_PAGE, DEFAULT_INFLIGHT_METRICS) == 6
    assert inflight(SGLANG_PAGE, ("sglang:token_usage",)) is None  # NaN is no count
    assert inflight(SGLANG_PAGE, VLLM) is None
    assert inflight("", VLLM) is None


def test_only_the_named_gauges_lines_count_and_are_parsed() -> None:
    """A gauge whose name merely starts with a named one is another gauge; a malformed line
    of another family does not spoil the count; a malformed line of a named gauge does."""
    names = ("vllm:num_requests_running",)
    page = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 2.0\n'
            "# TYPE vllm:num_requests_running_peak gauge\n"
            "vllm:num_requests_running_peak 40.0\n"
            "vllm:something_else{broken 1\n")
    assert inflight(page, names) == 2
    assert inflight(page.replace("_peak", ""), names) == 42
    with pytest.raises(ValueError, match="could not convert"):
        inflight("vllm:num_requests_running{broken 1\n", names)


def start_engine(janitor: ProcessJanitor, tmp_path: Path, running: int) -> tuple[Any, Path, int]:
    count = tmp_path / "running"
    count.write_text(f"{running} 0")
    port_file = tmp_path / "engine.json"
    proc = janitor.spawn([sys.executable, "-m", "tests.service.metrics_engine", str(count),
                          str(port_file)], cwd=ROOT)
    port = wait_for(lambda: port_file.exists() and json.loads(port_file.read_text())["port"],
                    what="the engine's metrics port")
    return proc, count, int(port)


def reading(running: Running) -> dict[str, Any]:
    status = running.status()
    return {"phase": status["phase"], **(status["engine_inflight"] or {})}


def test_the_migration_waits_for_the_engines_running_requests(janitor: ProcessJanitor,
                                                              tmp_path: Path) -> None:
    """1. an adopted engine whose metrics say 2 requests run; 2. a drain: it stays in
    migrating while they do (through several reads of the metrics, each newer than the
    last); 3. once the engine says 0, the drain goes on: the engine gets its SIGTERM and
    exits 0 (its own wait status), and the summary says so."""
    engine, count, port = start_engine(janitor, tmp_path, running=2)
    running = start_coordinator(janitor, tmp_path, *GRACEFUL,
                                "--adopt-pid", str(engine.pid), "--engine-metrics-url",
                                f"http://127.0.0.1:{port}/metrics")
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    first = wait_for(lambda: (r := reading(running))["inflight"] == 2 and r,
                     what="the probe's first read")
    assert first["phase"] in ("draining", "migrating")
    reads = count.with_suffix(".reads")
    wait_for(lambda: reading(running)["phase"] == "migrating", what="migrating")
    # The engine's own log of reads: several more, each answered 2, and still migrating.
    before = len(reads.read_text().split())
    wait_for(lambda: len(reads.read_text().split()) >= before + 3, what="three more reads")
    assert reading(running)["phase"] == "migrating"
    assert set(reads.read_text().split()) == {"2"}
    count.write_text("0 0")
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.wait(timeout=60) == 0
    assert summary["phase"] == "done"
    assert summary["outcome"] == "graceful"
    assert [(p["pid"], p["fate"], p["exit_code"], p["signal"]) for p in summary["processes"]] \
        == [(engine.pid, "exited", 0, "SIGTERM")]
    assert reads.read_text().split()[-1] == "0"


def test_an_engine_whose_metrics_cannot_be_read_does_not_hold_the_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``--engine-metrics-url`` names a port nothing listens on; 2. a drain of an adopted
    engine goes on at once past migrating, ends graceful, and /status says why the count
    is unknown."""
    engine, _count, port = start_engine(janitor, tmp_path, running=5)
    running = start_coordinator(janitor, tmp_path, *GRACEFUL, "--adopt-pid", str(engine.pid),
                                "--engine-metrics-url", f"http://127.0.0.1:{port}/nothing")
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful"
    assert summary["engine_inflight"]["inflight"] is None
    assert summary["engine_inflight"]["error"] == "answered 404"
    assert [(p["fate"], p["signal"]) for p in summary["processes"]] == [("exited", "SIGTERM")]


def test_a_page_without_end_is_cut_at_its_limit(janitor: ProcessJanitor,
                                                tmp_path: Path) -> None:
    """1. ``--engine-metrics-url`` names a page that never ends; 2. a drain of the adopted
    engine goes on past migrating and ends graceful, /status saying the page was too large;
    3. the engine's own record: each read it served was cut off by the reader after at most
    the limit and a few socket buffers, never streamed on."""
    engine, count, port = start_engine(janitor, tmp_path, running=5)
    running = start_coordinator(janitor, tmp_path, *GRACEFUL, "--adopt-pid", str(engine.pid),
                                "--engine-metrics-url", f"http://127.0.0.1:{port}/endless")
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful"
    assert summary["engine_inflight"]["error"] == f"page larger than {MAX_BODY_BYTES} bytes"
    served = [int(n) for n in count.with_suffix(".endless").read_text().split()]
    assert served
    assert all(n < MAX_BODY_BYTES + 16 * 1024 * 1024 for n in served), served


def test_a_slow_metrics_page_holds_the_last_count(janitor: ProcessJanitor,
                                                  tmp_path: Path) -> None:
    """1. an adopted engine whose metrics say 2 requests run; a drain reads them; 2. the
    engine then answers its metrics too slowly (busy, as vLLM's API server is while it
    streams): /status says the read is slow and keeps 2, the drain stays in migrating and the
    engine has received no signal (it runs, its reads log shows no new answer); 3. the engine
    answers again with 0: the drain goes on, the engine exits 0 on its SIGTERM."""
    engine, count, port = start_engine(janitor, tmp_path, running=2)
    running = start_coordinator(janitor, tmp_path, *GRACEFUL,
                                "--adopt-pid", str(engine.pid), "--engine-metrics-url",
                                f"http://127.0.0.1:{port}/slow")
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    wait_for(lambda: (r := reading(running))["inflight"] == 2 and r["phase"] == "migrating",
             what="the probe reading 2 while migrating")
    count.with_suffix(".slow").touch()
    slow = wait_for(lambda: (r := reading(running))["slow"] and r, what="a slow read")
    assert slow["inflight"] == 2
    assert slow["error"] == "not read whole within 5s"
    assert slow["phase"] == "migrating"
    assert engine.poll() is None
    count.write_text("0 0")
    count.with_suffix(".slow").unlink()
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful"
    assert summary["engine_inflight"]["inflight"] == 0
    assert summary["engine_inflight"]["slow"] is False
    assert count.with_suffix(".reads").read_text().split()[-1] == "0"


WRAPPER = """
import os, signal, subprocess, sys
engine = subprocess.Popen([sys.executable, "-m", "tests.service.metrics_engine", *sys.argv[1:]])
signal.signal(signal.SIGTERM, lambda *_: engine.terminate())
os._exit(engine.wait())
"""
"""A launcher that passes SIGTERM on to its engine and exits with its code. ``os._exit``, as
the kill may signal it after the engine exited: Python's exit restores SIGTERM's default
action before the process is gone, which would turn that late SIGTERM into a death by it."""
IDLE = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
print("ready", flush=True)
signal.sigwait([signal.SIGTERM])
"""


def test_the_count_is_shown_on_the_adopted_root_whose_tree_serves_the_metrics(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. two adopted roots: an idle process, and a wrapper whose child serves the metrics
    (2 requests running); 2. a drain reads them: /status shows the count on the wrapper, the
    root of the process that owns the listening socket (by the engine's own PID record and
    its parent in /proc), and none on the idle root; 3. the engine says 0: both trees exit
    0 on their SIGTERM."""
    count = tmp_path / "running"
    count.write_text("2 0")
    port_file = tmp_path / "engine.json"
    wrapper = janitor.spawn([sys.executable, "-c", WRAPPER, str(count), str(port_file)],
                            cwd=ROOT)
    idle = janitor.spawn([sys.executable, "-c", IDLE], stdout=subprocess.PIPE, text=True)
    assert idle.stdout is not None
    assert idle.stdout.readline() == "ready\n"
    engine = wait_for(lambda: port_file.exists() and json.loads(port_file.read_text()),
                      what="the engine's metrics port")
    stat = Path(f"/proc/{engine['pid']}/stat").read_text()
    assert int(stat[stat.rindex(")") + 2:].split()[1]) == wrapper.pid  # ground truth: its parent
    running = start_coordinator(janitor, tmp_path, *GRACEFUL,
                                "--adopt-pid", str(wrapper.pid), "--adopt-pid", str(idle.pid),
                                "--engine-metrics-url",
                                f"http://127.0.0.1:{engine['port']}/metrics")
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
    status = wait_for(lambda: (s := running.status())["engine_inflight"]["inflight"] == 2 and s,
                      what="the probe's first read")
    assert status["engine_inflight"]["root"] == wrapper.pid
    assert sorted((a["pid"], a["inflight"]) for a in status["adopted"]) == sorted(
        [(wrapper.pid, 2), (idle.pid, None)])
    count.write_text("0 0")
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert wrapper.wait(timeout=60) == 0
    assert idle.wait(timeout=60) == 0
    assert summary["outcome"] == "graceful"
    assert summary["engine_inflight"]["root"] == wrapper.pid


def test_the_progress_line_and_the_status_text_count_the_engines_requests() -> None:
    """The drain's line counts the adopted engine's in-flight requests with the workers';
    the status text says whose tree they are in and where they were read."""
    reading = {"url": "http://127.0.0.1:8000/metrics", "inflight": 3, "read_at": 1.0,
               "error": None, "slow": False, "root": 4200}
    doc = {"phase": "migrating", "generation": 4, "migrations": [], "counts": {},
           "workers": [{"id": "w1", "pid": 1, "role": "main", "inflight": 2,
                       "state": "draining"}],
           "engine_inflight": reading}
    assert "5 in flight" in progress_line(doc)
    assert "engine      3 in flight (the tree of pid 4200), from " \
           "http://127.0.0.1:8000/metrics" in status_text(doc).splitlines()
    unread = {**reading, "inflight": None, "root": None, "error": "answered 404"}
    assert "engine      in flight unknown, from http://127.0.0.1:8000/metrics: answered 404" \
        in status_text({**doc, "engine_inflight": unread}).splitlines()


def test_requests_the_engine_still_counts_when_it_ends_are_counted_as_cut(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. an adopted engine whose metrics say 1 request runs, to its end (as a stream longer
    than the budget); 2. the drain waits out the migration window, then SIGTERMs it; the probe
    reads on while the kill runs; 3. the engine exits 0, its last answer (its own reads log)
    still counting the request: the summary counts it cut, in ``lost_requests``, and the
    outcome says so. A stream the engine's end cut is never "0 lost"."""
    engine, count, port = start_engine(janitor, tmp_path, running=1)
    # The probe holds this drain for its whole migration window: a budget of 19 s keeps it
    # short (4.75 s) while the kill's share (14.25 s) still fits the engine's exit under load.
    running = start_coordinator(janitor, tmp_path, *GRACEFUL, "--grace-period", "20",
                                "--adopt-pid", str(engine.pid),
                                "--engine-metrics-url", f"http://127.0.0.1:{port}/metrics")
    with running.client(timeout=120) as client:
        summary = client.get("/drain").json()
    assert engine.wait(timeout=60) == 0
    assert count.with_suffix(".reads").read_text().split()[-1] == "1"
    drain = summary["drain"]
    assert drain["cut_requests"] == 1
    assert drain["lost_requests"] == 1
    assert summary["outcome"] == "lost_requests"
    assert any("cut by the kill" in cause for cause in drain["causes"]), drain["causes"]
    assert [(p["fate"], p["exit_code"]) for p in summary["processes"]] == [("exited", 0)]
