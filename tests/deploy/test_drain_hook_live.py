"""The preStop drain hook against the real coordinator draining a real process tree."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordinator import exit_codes
from tests.deploy.rendering import DRAIN_HOOK
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

HOOK_EXIT_S = 60.0


def _start_engine(janitor: ProcessJanitor, tmp: Path,
                  *extra: str) -> tuple[subprocess.Popen[Any], dict[str, Any]]:
    ready = tmp / "engine.ready.json"
    records = tmp / "records"
    records.mkdir()
    proc = janitor.spawn_python(
        [
            "-m",
            "devstack.sim",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--record-dir",
            str(records),
            "--schedulers",
            "2",
            "--no-watchdog",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    info: dict[str, Any] = wait_for(
        lambda: ready.exists() and json.loads(ready.read_text()), what="simulated engine ready"
    )
    return proc, info


@pytest.mark.parametrize(
    ("engine_args", "hook_code", "main_status"),
    [(("--graceful-main",), exit_codes.OK, 0),
     ((), exit_codes.SIGNALLED, -signal.SIGKILL)],
    ids=["graceful-main", "stock-sglang-sigkills-itself"],
)
def test_hook_drains_an_adopted_engine_through_the_real_coordinator(
    janitor: ProcessJanitor, tmp_path: Path, engine_args: tuple[str, ...], hook_code: int,
    main_status: int,
) -> None:
    """1. Start a simulated engine (main process, two schedulers, a detokenizer): one whose
       main process stops its children and exits 0 on SIGTERM, or one that, like stock
       SGLang, SIGKILLs its tree and itself.
    2. Start the coordinator with a token file, adopting the engine's main process by PID.
    3. Run the hook as the kubelet would: URL and token file from the environment.
    4. The hook exits once the drain is done, with 0 only when the main process really
       exited 0 (its wait status), and names the self-SIGKILL otherwise; every engine process
       is gone: the kubelet's SIGTERM that follows finds nothing left to kill.
    """
    proc, engine = _start_engine(janitor, tmp_path, *engine_args)
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
    assert proc.wait(timeout=HOOK_EXIT_S) == main_status
    assert hook.returncode == hook_code, out.decode() + running.log.read_text()
    assert "phase=done" in out.decode()
    if main_status != 0:
        assert f"pid {engine['pid']}) died of a SIGKILL sent by the engine itself" in (
            out.decode())
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
