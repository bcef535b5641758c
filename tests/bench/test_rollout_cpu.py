"""``bench/rollout_cpu.py`` charges each process's CPU to the part its command line (or its
nearest ancestor's) names, against what the processes measured of themselves."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.rollout_cpu import CpuByRole, part_of
from tests.support.processes import ProcessJanitor

SPIN = """
import os, subprocess, sys, time
code, until = sys.argv[1], sys.argv[2]
child = None
if "with-child" in sys.argv:
    child = subprocess.Popen([sys.executable, "-c", code, code, "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    child_used = float(child.stdout.readline())
while time.process_time() < 0.2:
    pass
print(time.process_time() + (child_used if child else 0.0), flush=True)
if until == "-":
    sys.stdin.read()  # the parent closes it
else:
    while not os.path.exists(until):  # the test makes it: a microsecond a look
        time.sleep(0.005)
if child:
    child.stdin.close()
    child.wait()
"""
TICK_S = 0.01
"""/proc counts CPU in clock ticks, user and system apart: each process's count may be short
of its own by up to two."""


def test_parts_by_command_line() -> None:
    assert part_of("/venv/bin/python -m coordinator serve --port 1 ") == "coordinator"
    assert part_of("python -m devstack.logged_engine --port 2 ") == "engine"
    assert part_of("python -m continuation_proxy --upstream u ") == "proxy"
    assert part_of("python -m bench.rollout_load --url u ") == "load"
    assert part_of("/r/bin/python /r/bin/smg launch --port 3 ") == "router"
    assert part_of("smg::router ") == "router"
    assert part_of("python /x/drain_hook.py --main-by-kubelet ") == "hook"
    assert part_of("python -c pass ") is None


def _release(path: Path) -> None:
    path.touch()


def test_each_process_is_charged_to_its_part_and_kept_once_it_ended(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A sample before anything starts.
    2. A process named as the load, and a child of it named as nothing (the load's too),
       spin 0.2 s of CPU each; a process of the test's own, named as nothing (the rig's),
       spins as long. Each says what it used, then waits.
    3. A sample: the load's CPU is what its two processes said (within two clock ticks each),
       the rig's at least what its process said.
    4. The load's processes end; a sample: the load keeps what it was charged."""
    load_done, rig_done = tmp_path / "load", tmp_path / "rig"
    cpu = CpuByRole()
    cpu.sample()
    load = janitor.spawn([sys.executable, "-c", SPIN, SPIN, str(load_done), "with-child",
                          "bench.rollout_load"], stdout=subprocess.PIPE, text=True)
    rig = janitor.spawn([sys.executable, "-c", SPIN, SPIN, str(rig_done)],
                        stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    assert rig.stdout is not None
    load_said = float(load.stdout.readline())
    rig_said = float(rig.stdout.readline())
    cpu.sample()
    charged = cpu.used[-1]["load"] - cpu.used[0].get("load", 0.0)
    assert charged == pytest.approx(load_said, abs=4 * TICK_S)
    assert cpu.used[-1]["rig"] - cpu.used[0]["rig"] >= rig_said - 2 * TICK_S
    _release(load_done)
    assert load.wait(timeout=60) == 0
    cpu.sample()
    assert cpu.used[-1]["load"] == cpu.used[-2]["load"]
    _release(rig_done)
    assert rig.wait(timeout=60) == 0


def test_a_process_is_charged_to_its_parents_part_until_its_exec(tmp_path: Path) -> None:
    """The race a sampler meets with every process the bench starts:

    1. the test forks a child that waits before its exec: a sample then sees the test's own
       command line in it;
    2. the child execs into a process named as the load, spins, says what it used;
    3. a sample: the load is charged all of it (the first look did not settle its part);
    4. the child ends (the test reaps it)."""
    done = tmp_path / "end"
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    cpu = CpuByRole()
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's runs here
        try:
            os.close(go_w)
            os.close(out_r)
            os.dup2(out_w, 1)
            os.read(go_r, 1)
            os.execv(sys.executable, [sys.executable, "-c", SPIN, SPIN, str(done),
                                      "bench.rollout_load"])
        finally:
            os._exit(127)
    try:
        os.close(go_r)
        os.close(out_w)
        cpu.sample()
        assert cpu.used[-1].get("load", 0.0) == 0.0
        os.write(go_w, b"x")
        with os.fdopen(out_r) as out:
            said = float(out.readline())
        cpu.sample()
        assert cpu.used[-1]["load"] == pytest.approx(said, abs=2 * TICK_S)
        _release(done)
    finally:
        os.close(go_w)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running: the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
