from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.sim import EngineHandle, start_engine
from tests.support.processes import ProcessJanitor

StartEngine = Callable[..., EngineHandle]
STOP_TIMEOUT_S = 30.0


@pytest.fixture
def start_sim(janitor: ProcessJanitor, tmp_path: Path) -> Iterator[StartEngine]:
    """Start a simulated engine (two schedulers unless told otherwise).

    At the end of the test each engine still running gets SIGTERM on its main process (which
    ends its tree and collects its children), then the janitor sweeps whatever is left.
    """
    counter = itertools.count()
    started: list[EngineHandle] = []

    def start(**knobs: Any) -> EngineHandle:
        knobs.setdefault("schedulers", 2)
        engine = start_engine(janitor.spawn, tmp_path / f"engine-{next(counter)}", **knobs)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        if engine.proc.poll() is None:
            os.kill(engine.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.proc.wait(timeout=STOP_TIMEOUT_S)
