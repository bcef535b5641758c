"""``bench/rollout_cpu.py`` charges each process's CPU to the part its command line (or its
nearest ancestor's) names, against what the processes measured of themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.rollout_cpu import CpuByRole, part_of
from tests.support.processes import ProcessJanitor

SPIN = """
import subprocess, sys, time
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
    open(until).read()  # a FIFO: returns once the test opened and closed it
if child:
    child.stdin.close()
    child.wait()
"""
TICK_S = 0.01
"""/proc counts CPU in clock ticks, user and system apart: each process's count may be short
of its own by up to two."""


def test_parts_by_command_line() -> None:
    assert part_of("/venv/bin/python -m coordinator serve --port 1 ") == "coordinator"
    assert part_of("python -m devstack.local_stack engine --port 2 ") == "engine"
    assert part_of("python -m continuation_proxy --upstream u ") == "proxy"
    assert part_of("python -m bench.rollout_load --url u ") == "load"
    assert part_of("/r/bin/python /r/bin/smg launch --port 3 ") == "router"
    assert part_of("python /x/drain_hook.py --main-by-kubelet ") == "hook"
    assert part_of("python -c pass ") is None


def _release(fifo: Path) -> None:
    with fifo.open("w"):
        pass


def test_each_process_is_charged_to_its_part_and_kept_once_it_ended(
        janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. A sample before anything starts.
    2. A process named as the load, and a child of it named as nothing (the load's too),
       spin 0.2 s of CPU each; a process of the test's own, named as nothing (the rig's),
       spins as long. Each says what it used, then waits.
    3. A sample: the load's CPU is what its two processes said (within two clock ticks each),
       the rig's at least what its process said.
    4. The load's processes end; a sample: the load keeps what it was charged."""
    load_fifo, rig_fifo = tmp_path / "load", tmp_path / "rig"
    os.mkfifo(load_fifo)
    os.mkfifo(rig_fifo)
    cpu = CpuByRole()
    cpu.sample()
    load = janitor.spawn([sys.executable, "-c", SPIN, SPIN, str(load_fifo), "with-child",
                          "bench.rollout_load"], stdout=subprocess.PIPE, text=True)
    rig = janitor.spawn([sys.executable, "-c", SPIN, SPIN, str(rig_fifo)],
                        stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    assert rig.stdout is not None
    load_said = float(load.stdout.readline())
    rig_said = float(rig.stdout.readline())
    cpu.sample()
    charged = cpu.used[-1]["load"] - cpu.used[0].get("load", 0.0)
    assert charged == pytest.approx(load_said, abs=4 * TICK_S)
    assert cpu.used[-1]["rig"] - cpu.used[0]["rig"] >= rig_said - 2 * TICK_S
    _release(load_fifo)
    assert load.wait(timeout=60) == 0
    cpu.sample()
    assert cpu.used[-1]["load"] == cpu.used[-2]["load"]
    _release(rig_fifo)
    assert rig.wait(timeout=60) == 0
