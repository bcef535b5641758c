"""deploy/systemd/sglang-init.service: `systemd-analyze verify`, one budget, and the unit run
and stopped as systemd runs and stops it, with the SGLang-shaped engine in SGLang's place."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devstack.routers import free_port
from devstack.sim import EngineKnobs
from devstack.sim.records import read_records
from tests.deploy.engine_shapes import ENV, RELEASE, install, moved
from tests.deploy.held_stream import Stream
from tests.init.wrapper import Wrapper
from tests.service.servers import ROOT
from tests.support.processes import ProcessJanitor, wait_for

UNIT = ROOT / "deploy" / "systemd" / "sglang-init.service"
CLI = "/usr/local/bin/shutdown-coordinator"
ENGINE_PYTHON = "/opt/sglang/bin/python"
HOLD_AT = 5


def _unit() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, val = line.partition("=")
            found.setdefault(key, []).append(val)
    return found


def _environment(unit: dict[str, list[str]], runtime: Path) -> dict[str, str]:
    pairs = (v.replace("%t", str(runtime)).split("=", 1) for v in unit["Environment"])
    return {k: v for k, v in pairs}


def test_one_budget_and_the_stop_reaches_the_coordinator_alone() -> None:
    """1. TimeoutStopSec (systemd's SIGKILL) is the grace period the coordinator is told; the
       drain ends a safety margin before it.
    2. KillMode=mixed: systemd's SIGTERM goes to the main process, the coordinator, alone
       (never to every process of the engine at once); its SIGKILL to the whole cgroup only
       at the end.
    3. ExecStart runs the engine behind ``shutdown-coordinator run --``."""
    unit = _unit()
    env = _environment(unit, Path("/run"))
    assert float(unit["TimeoutStopSec"][-1].rstrip("s")) == float(
        env["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"])
    assert 0 < float(env["SHUTDOWN_COORDINATOR_SAFETY_MARGIN_S"]) < float(
        env["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"])
    assert unit["KillMode"] == ["mixed"]
    argv = shlex.split(unit["ExecStart"][-1])
    assert argv[:3] == [CLI, "run", "--"]
    assert argv[3:6] == [ENGINE_PYTHON, "-m", "sglang.launch_server"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """1. Stage the unit with its absolute commands replaced by stubs (verify checks they
       exist). 2. `systemd-analyze verify`: no error, no warning; a misspelt KillMode is
       caught (the clean result means something)."""
    units, stub = tmp_path / "units", tmp_path / "shutdown-coordinator"
    units.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    text = UNIT.read_text().replace(CLI, str(stub)).replace(ENGINE_PYTHON, sys.executable)

    def verify(body: str) -> subprocess.CompletedProcess[str]:
        (units / "sglang-init.service").write_text(body)
        return subprocess.run(["systemd-analyze", "verify", "--man=no", "sglang-init.service"],
                              cwd=units, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
                              capture_output=True, text=True, timeout=60, check=False)

    done = verify(text)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr
    assert "mixd" in verify(text.replace("KillMode=mixed", "KillMode=mixd")).stderr


def test_systemctl_stop_drains_the_engine_whole(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run ExecStart as systemd would: the unit's Environment= applied, SGLang's command
       running the SGLang-shaped engine (two schedulers and a detokenizer with PDEATHSIG, a
       child watchdog; on SIGTERM it serves its open streams to their end, then stops its
       children and exits 0), addresses moved to free loopback ports.
    2. A stream is held in flight after 5 tokens.
    3. ``systemctl stop`` with KillMode=mixed: SIGTERM to the main process alone.
    4. While the drain waits for the engine's in-flight gauge, release the stream with
       SIGUSR1 sent to the coordinator, which passes it on to the engine's main process.
    5. The stream ends whole; the engine's main process was signalled first (SGLang's
       profile) and every process ran its cleanup and exited 0; the main process, and so
       the unit, exits 0 before systemd's SIGKILL would have been due; nothing is left."""
    unit = _unit()
    runtime = tmp_path / "run"
    (runtime / "sglang-init").mkdir(parents=True)
    env = _environment(unit, runtime)
    argv = shlex.split(unit["ExecStart"][-1])
    engine_port = free_port()
    installed = install(["python3", *argv[4:6]], tmp_path / "shim")  # the engine's python
    records = tmp_path / "records"
    knobs = EngineKnobs(schedulers=2, watchdog=True, teardown_s=0.2)
    sim_args = ["--record-dir", str(records), "--ready-file", str(tmp_path / "ready.json"),
                *knobs.to_argv()]
    env.update(installed.env)
    env.update({ENV: json.dumps({"sim_args": sim_args, "hold_at": HOLD_AT}),
                "SHUTDOWN_COORDINATOR_PORT": "0",
                "SHUTDOWN_COORDINATOR_PORT_FILE": str(tmp_path / "port.json"),
                "SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL":
                    f"http://127.0.0.1:{engine_port}/metrics"})
    command = [sys.executable, "-m", "coordinator", *argv[1:3],
               *installed.argv, *moved(argv[6:], port=engine_port)]
    log, out = tmp_path / "wrapper.log", tmp_path / "wrapper.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = janitor.spawn(command, cwd=ROOT, env=env, stdout=stdout, stderr=err)
    wrapper = Wrapper(proc, tmp_path, log, out)
    ready = wait_for(lambda: (tmp_path / "ready.json").exists() and json.loads(
        (tmp_path / "ready.json").read_text()), timeout=120, what="the engine ready")
    stream = Stream(ready["url"], "Stop me whole:", 40)
    while len(stream.chunks) < HOLD_AT:
        assert stream._read_chunk()
    proc.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process alone
    url = wrapper.url()
    wait_for(lambda: httpx.get(url + "/status", timeout=10).json()["phase"] == "migrating",
             what="the drain waiting for the engine's stream")
    assert read_records(records)[0]["signal"] is None  # nothing signalled yet
    proc.send_signal(RELEASE)
    stream.read_to_end()
    assert stream.done
    assert len(stream.chunks) == 40
    assert wrapper.wait() == 0, log.read_text()
    found = {r["pid"]: r for r in read_records(records)}
    main = found[ready["pid"]]
    for record in found.values():
        assert (record["cleanup"], record["exit_code"]) == ("finished", 0), record
        assert main["signalled_at"] <= record["signalled_at"], found
    assert main["signals"] == ["SIGTERM"]  # SIGUSR1 released the stream, unrecorded
    summary = wrapper.summary()
    assert summary["drain"] == "graceful"
    assert summary["exit_code"] == "0"
