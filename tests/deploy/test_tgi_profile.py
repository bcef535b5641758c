"""The ``tgi`` engine profile, drained for real against text-generation-inference's shape (TGI
needs a GPU; ``tests/deploy/tgi_shape.py``: a ``text-generation-launcher`` that owns a router
and two shards, each in its own process group, and stops them as TGI v3.3.7's launcher does).

There is no TGI overlay: the coordinator runs with ``--engine tgi`` (or ``generic`` and the
profile's adopt pattern), its metrics URL moved to the router's port, confined to the
launcher's tree as a pod's PID namespace would confine it. The drain is the kubelet's
``preStop`` ``httpGet``: ``GET /drain``, which answers at the end. Everything is judged from
ground truth: each process's own end record, the launcher's wait status (the test is its
parent) and its children's (the launcher is theirs, and records them), ``/proc``.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from coordinator.engines import PROFILES
from devstack.sim import expected_tokens
from tests.deploy.held_stream import Stream, alive, watch
from tests.deploy.tgi_shape import RELEASE, TgiEngine, start
from tests.service.servers import Running, start_coordinator
from tests.support.processes import ProcessJanitor

pytestmark = pytest.mark.timeout(90)

HOLD_AT = 5
"""Tokens a stream streams before it waits for the test's release."""
STREAM_TOKENS = 40
PROMPT = "Drain me whole:"
GRACEFUL_TERMINATION_TIMEOUT_S = 10
"""The launcher's ``--graceful-termination-timeout``: twice it (router, then shards) fits the
kill's share of the budget (22 s of ``--grace-period 60``), as the profile's note asks."""


def start_pod(janitor: ProcessJanitor, tmp: Path, profile: str,
              teardown_s: float = 0.2) -> tuple[TgiEngine, Running]:
    """The launcher (the container's main process, started by the test) and a coordinator
    with ``--engine profile``: for ``tgi``, its metrics URL moved onto the router's port;
    for ``generic``, the ``tgi`` profile's adopt patterns. Returns once the coordinator lists
    the launcher's whole tree."""
    with (tmp / "engine.log").open("ab") as log:
        engine = start(janitor.spawn, tmp, shards=2, hold_at=HOLD_AT, teardown_s=teardown_s,
                       graceful_termination_timeout=GRACEFUL_TERMINATION_TIMEOUT_S,
                       stdout=log, stderr=log)
    tgi = PROFILES["tgi"]
    if profile == "tgi":
        assert tgi.metrics_url is not None
        metrics = urlsplit(tgi.metrics_url)._replace(netloc=f"127.0.0.1:{engine.port}")
        args = ["--engine-metrics-url", urlunsplit(metrics)]
    else:
        args = [f"--adopt-pattern={pattern}" for pattern in tgi.adopt_patterns]
    coordinator = start_coordinator(janitor, tmp, "--engine", profile, *args,
                                    "--grace-period", "60", "--confine-to-pid", str(engine.pid))
    watch(coordinator, lambda s: set(engine.pids()) <= {p["pid"] for p in s["processes"]},
          "the coordinator lists the launcher's whole tree")
    return engine, coordinator


class Drain:
    """The kubelet's ``preStop`` ``httpGet``: ``GET /drain``, answered at the drain's end."""

    def __init__(self, coordinator: Running) -> None:
        self.answer: httpx.Response | None = None
        self._thread = threading.Thread(target=self._call, args=(coordinator,), daemon=True)
        self._thread.start()

    def _call(self, coordinator: Running) -> None:
        with coordinator.client(timeout=90) as client:
            self.answer = client.get("/drain")

    def summary(self) -> dict[str, Any]:
        self._thread.join(timeout=90)
        assert self.answer is not None, "GET /drain did not answer"
        body: dict[str, Any] = self.answer.json()
        assert body["phase"] == "done", body
        return body


def test_the_tgi_profile_lets_the_launcher_stop_its_router_then_its_shards(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start the launcher (router and two shards) and the coordinator with ``--engine
       tgi``, its metrics URL on the router's port; it adopts the launcher by its name.
    2. Put a stream in flight (held after a few tokens) and drain (``GET /drain``).
    3. The coordinator waits in ``migrating`` while the router's gauges say 1, nothing
       signalled yet; released, the stream ends whole.
    4. Then the launcher alone gets SIGTERM (tier ``tgi-root``): it stops its router, waits
       for it, then its shards; every process exits 0 after its teardown, none SIGKILLed,
       nothing left; the summary's fates are those of the records.
    """
    engine, coordinator = start_pod(janitor, tmp_path, "tgi")
    launcher = engine.pid
    [router] = engine.pids("router")
    shards = engine.pids("shard")
    stream = Stream(engine.url, PROMPT, STREAM_TOKENS)
    drain = Drain(coordinator)

    watch(coordinator, lambda s: s["phase"] == "migrating"
          and (s.get("engine_inflight") or {}).get("inflight") == 1,
          "the coordinator waiting on the router's in-flight gauge")
    assert [r["signals"] for r in engine.records().values() if r["signals"]] == []
    os.kill(router, RELEASE)
    stream.read_to_end()
    summary = drain.summary()
    launcher_code = engine.proc.wait(timeout=60)  # reaped after the coordinator's judgement

    # The stream: every token, in order, then [DONE].
    assert stream.done, "the stream was cut"
    assert stream.text == "".join(expected_tokens(PROMPT, STREAM_TOKENS))
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The processes' own records and wait statuses.
    records = engine.records()
    assert sorted(records) == sorted(engine.pids())
    main = records[launcher]
    assert launcher_code == 0, main
    assert {r["exit_code"] for r in records.values()} == {0}, records
    assert {r["cleanup"] for r in records.values()} == {"finished"}, records
    assert main["children_exit_codes"] == {str(pid): 0 for pid in (router, *shards)}
    assert main["sigkilled_children"] == []
    # Each in its own process group, signalled once, by the launcher: the router first,
    # the shards once the router had exited.
    assert all(r["pgid"] == pid for pid, r in records.items()), records
    assert [r["signals"] for r in records.values()] == [["SIGTERM"]] * len(records)
    assert main["stop_order"][0] == router
    assert sorted(main["stop_order"][1:]) == sorted(shards)
    assert all(main["signalled_at"] <= r["signalled_at"] for r in records.values())
    assert all(records[router]["ended_at"] <= records[s]["signalled_at"] for s in shards)
    assert records[router]["streams_open_at_signal"] == 0  # the coordinator waited for it
    assert alive(engine.pids()) == []
    # The coordinator's summary says the same.
    assert summary["outcome"] == "graceful", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert sorted(report) == sorted(records)
    assert {p["fate"] for p in report.values()} == {"exited"}, report
    assert not [p for p in report.values() if p.get("killed_at")], report
    for pid, process in report.items():
        assert process["exit_code"] in (None, records[pid]["exit_code"]), process
    assert report[launcher]["tier"] == "tgi-root"
    assert report[launcher]["exit_code"] == 0
    assert [pid for pid, p in report.items() if p["signal"]] == [launcher]


def test_the_generic_order_makes_the_tgi_launcher_call_it_a_crash(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start the same tree, the coordinator with ``--engine generic`` (children first,
       deepest first, the launcher last) and the ``tgi`` profile's adopt pattern.
    2. Drain (``GET /drain``).
    3. The router and the shards get their SIGTERM from the coordinator while the launcher
       still runs: the first to exit is a crash to it (``Shard N crashed`` or ``Webserver
       Crashed``); it stops the rest as TGI's does (SIGTERM, a bounded wait: each ends its
       teardown and exits 0, none is SIGKILLed) and exits 1; the drain is not graceful.

    The shards' teardown (1 s) outlasts the router's shutdown, so the launcher has seen
    the first exit well before the last one lets the coordinator's last tier signal it (a
    SIGTERM it took first would be a stop to it, as to TGI's, not a crash).
    """
    engine, coordinator = start_pod(janitor, tmp_path, "generic", teardown_s=1.0)
    launcher = engine.pid
    summary = Drain(coordinator).summary()
    launcher_code = engine.proc.wait(timeout=60)  # reaped after the coordinator's judgement

    records = engine.records()
    assert sorted(records) == sorted(engine.pids())
    main = records[launcher]
    assert launcher_code == 1, main
    assert main["exit_code"] == 1
    assert re.fullmatch(r"Shard \d crashed|Webserver Crashed", main["detail"]), main
    first = min((r for r in records.values() if r["signalled_at"]),
                key=lambda r: r["signalled_at"])
    assert first["pid"] != launcher, "the generic order signals the children first"
    crashed_before_signalled = main["signalled_at"] is None \
        or main["cleanup_started_at"] <= main["signalled_at"]
    assert crashed_before_signalled, main
    children = [pid for pid in engine.pids() if pid != launcher]
    assert main["children_exit_codes"] == {str(pid): 0 for pid in children}
    assert main["sigkilled_children"] == []
    assert all(records[pid]["cleanup"] == "finished" for pid in children), records
    assert alive(engine.pids()) == []
    # The summary: the main process exited 1.
    assert summary["outcome"] == "failed", summary.get("drain")
    report = {p["pid"]: p for p in summary["processes"]}
    assert sorted(report) == sorted(records)
    assert report[launcher]["exit_code"] == 1, report[launcher]
    assert {report[pid]["tier"] for pid in children} == {"depth-1"}
