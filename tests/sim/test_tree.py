"""The simulated engine's process tree comes up shaped like SGLang and records itself."""

from __future__ import annotations

import os

import psutil

from devstack.sim import EngineHandle
from tests.sim.conftest import StartEngine


def _cmdline(pid: int) -> str:
    return " ".join(psutil.Process(pid).cmdline())


def _assert_listed_processes_are_live_and_parented(engine: EngineHandle) -> None:
    for p in engine.processes:
        assert psutil.Process(p.pid).ppid() == p.ppid, p


def test_tree_has_schedulers_and_a_detokenizer_under_main(start_sim: StartEngine) -> None:
    """1. Start the engine with 2 schedulers. 2. The ready file lists main, 2 schedulers and
    a detokenizer. 3. Each child is the main process's child, named by its command line.
    4. Each process wrote its record: up, cleanup not started, PDEATHSIG armed in children."""
    engine = start_sim(schedulers=2)
    assert [p.role for p in engine.processes] == ["main", "scheduler", "scheduler", "detokenizer"]
    assert engine.processes[0].pid == engine.pid == engine.proc.pid
    _assert_listed_processes_are_live_and_parented(engine)
    children = {p.pid for p in psutil.Process(engine.pid).children()}
    assert children == {p.pid for p in engine.processes[1:]}
    for rank, pid in enumerate(engine.pids("scheduler")):
        assert f"-m devstack.sim.scheduler --rank {rank}" in _cmdline(pid)
    assert "-m devstack.sim.detokenizer" in _cmdline(engine.pids("detokenizer")[0])

    records = {r["pid"]: r for r in engine.records()}
    assert set(records) == {p.pid for p in engine.processes}
    for p in engine.processes:
        record = records[p.pid]
        assert record["role"] == p.role
        assert record["ppid"] == p.ppid
        assert record["cleanup"] == "not started"
        assert record["signal"] is None
        assert record["pdeathsig"] == (None if p.role == "main" else "SIGKILL")


def test_dp_controller_owns_its_schedulers(start_sim: StartEngine) -> None:
    """1. Start with --dp 2. 2. Main has a DP controller and a detokenizer as children.
    3. The two schedulers are the controller's children, not main's."""
    engine = start_sim(dp=2)
    roles = sorted(p.role for p in engine.processes)
    assert roles == ["detokenizer", "dp_controller", "main", "scheduler", "scheduler"]
    _assert_listed_processes_are_live_and_parented(engine)
    (controller,) = engine.pids("dp_controller")
    assert psutil.Process(controller).ppid() == engine.pid
    assert "-m devstack.sim.dp_controller --schedulers 2" in _cmdline(controller)
    for pid in engine.pids("scheduler"):
        assert psutil.Process(pid).ppid() == controller
    assert engine.pid == engine.proc.pid != os.getpid()
