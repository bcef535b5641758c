"""The preStop drain hook against the real coordinator draining a real process tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from tests.deploy.rendering import DRAIN_HOOK
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

HOOK_EXIT_S = 60.0


def _start_engine(janitor: ProcessJanitor, tmp: Path) -> dict[str, Any]:
    ready = tmp / "engine.ready.json"
    records = tmp / "records"
    records.mkdir()
    janitor.spawn_python(
        [
            "-m",
            "coordinator.sim",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--record-dir",
            str(records),
            "--schedulers",
            "2",
            "--no-watchdog",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    info: dict[str, Any] = wait_for(
        lambda: ready.exists() and json.loads(ready.read_text()), what="simulated engine ready"
    )
    return info


def test_hook_drains_an_adopted_engine_through_the_real_coordinator(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Start a simulated engine (main process, two schedulers, a detokenizer).
    2. Start the coordinator with a token file, adopting the engine's main process by PID.
    3. Run the hook as the kubelet would: URL and token file from the environment.
    4. The hook exits 0 with the summary once the drain is done, and every engine process
       is gone: the kubelet's SIGTERM that follows finds nothing left to kill.
    """
    engine = _start_engine(janitor, tmp_path)
    pids = [engine["pid"], *(p["pid"] for p in engine["processes"])]
    running = start_coordinator(
        janitor, tmp_path, *FAST, "--adopt-pid", str(engine["pid"]), token="live-token"
    )
    token_file = tmp_path / "coordinator.token"
    hook = janitor.spawn(
        [sys.executable, str(DRAIN_HOOK)],
        env={
            "SHUTDOWN_COORDINATOR_URL": running.url,
            "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(token_file),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = hook.communicate(timeout=HOOK_EXIT_S)
    assert hook.returncode == 0, out.decode() + running.log.read_text()
    assert "phase=done" in out.decode()
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    for pid in alive:
        # Only the engine's main process, our own child, may linger: as a zombie not yet reaped.
        assert pid == engine["pid"]
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
