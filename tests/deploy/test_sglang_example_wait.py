"""The drainable SGLang server's wait for the engine's children to be gone
(``deploy/examples/sglang/drainable_server.py``, ``_wait_gone``), on real processes shaped
like SGLang's data-parallel tree: a scheduler is the DP controller's child, not the main
process's, and stays a zombie until the controller exits. The wait must see that exit when it
happens, not at its timeout; a process still running is returned."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

import psutil

from tests.support.processes import ProcessJanitor

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "sglang" / "drainable_server.py"
LONG_S = 120.0
"""A timeout no passing run comes near: only a wait that missed the exit runs into it."""

# The controller: starts a scheduler that waits for a signal, prints its PID, and never reaps
# it (it blocks reading a pipe nobody writes), as SGLang's DP controller holds its schedulers
# until its own exit.
CONTROLLER = """
import os, subprocess, sys
scheduler = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
print(scheduler.pid, flush=True)
r, w = os.pipe()
os.read(r, 1)
"""


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_drainable_server", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_zombie_grandchild_counts_as_gone_when_it_exits(janitor: ProcessJanitor) -> None:
    """1. A controller process starts a scheduler and never reaps it;
    2. the wait starts on the scheduler, which is then signalled and becomes a zombie;
    3. the wait returns nothing left, long before its timeout (which would return the
       scheduler): the scheduler's own state in /proc says zombie."""
    module = example()
    controller = janitor.spawn([sys.executable, "-c", CONTROLLER], stdout=-1, text=True)
    assert controller.stdout is not None
    scheduler = psutil.Process(int(controller.stdout.readline()))
    janitor.adopt(scheduler.pid)

    async def scenario() -> list[psutil.Process]:
        waiting = asyncio.create_task(module._wait_gone([scheduler], LONG_S))
        await asyncio.sleep(0)  # the wait has its pidfds before the exit
        os.kill(scheduler.pid, signal.SIGTERM)
        left: list[psutil.Process] = await waiting
        return left

    assert asyncio.run(scenario()) == []
    assert scheduler.status() == psutil.STATUS_ZOMBIE  # exited, not reaped: as in SGLang
    controller.kill()
    controller.wait()


def test_a_process_still_running_is_returned_and_one_reaped_is_not(
        janitor: ProcessJanitor) -> None:
    """A process that does not exit comes back once the timeout ran out; one already exited
    and reaped (its PID possibly reused since) is not waited for at all."""
    module = example()
    running = janitor.spawn([sys.executable, "-c", "import signal; signal.pause()"])
    ended = janitor.spawn([sys.executable, "-c", "pass"])
    ended_proc = psutil.Process(ended.pid)
    assert ended.wait(timeout=60) == 0
    left = asyncio.run(module._wait_gone([psutil.Process(running.pid), ended_proc], 0.05))
    assert [p.pid for p in left] == [running.pid]
    running.kill()
    running.wait()
