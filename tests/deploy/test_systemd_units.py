"""The systemd units (deploy/systemd/): one budget with the coordinator, the stop order,
`systemd-analyze verify`, and the engine's ExecStop run for real against a coordinator."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coordinator import exit_codes
from tests.deploy.rendering import REPO
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

SYSTEMD = REPO / "deploy" / "systemd"
COORDINATOR_UNIT = SYSTEMD / "shutdown-coordinator.service"
ENGINE_UNIT = SYSTEMD / "sglang.service"
DROP_IN = SYSTEMD / "engine-drain.conf"
CLI = "/usr/local/bin/shutdown-coordinator"

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(*paths: Path) -> Unit:
    """Sections of a unit and its drop-ins, every assignment kept in order (systemd allows
    repeated keys; later files add to or override earlier ones)."""
    unit: Unit = {}
    for path in paths:
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                unit.setdefault(section, [])
                continue
            key, _, value = line.partition("=")
            unit[section].append((key.strip(), value.strip()))
    return unit


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: Unit, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert found, f"[{section}] {key}= missing"
    return found[-1]


def seconds(text: str) -> float:
    assert text.endswith("s") or text.isdigit(), f"use seconds: {text}"
    return float(text.rstrip("s"))


def env_file(path: Path) -> dict[str, str]:
    pairs = [
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return {k.strip(): v.strip() for k, v in pairs}


def environment(unit: Unit) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values(unit, "Service", "Environment"))


@pytest.fixture(scope="module")
def engine() -> Unit:
    return parse_unit(ENGINE_UNIT, DROP_IN)


@pytest.fixture(scope="module")
def coordinator() -> Unit:
    return parse_unit(COORDINATOR_UNIT)


@pytest.fixture(scope="module")
def settings() -> dict[str, str]:
    return env_file(SYSTEMD / "coordinator.env")


def test_engine_stop_budget_matches_the_coordinator(engine: Unit, settings: dict[str, str]) -> None:
    """1. The engine's TimeoutStopSec (how long systemd lets ExecStop run) is the grace
       period the coordinator is told; the drain ends a safety margin before it.
    2. KillMode=mixed: after the drain, SIGTERM goes to the main process only and the
       final SIGKILL to the whole cgroup, so nothing outlives the unit.
    """
    stop = seconds(value(engine, "Service", "TimeoutStopSec"))
    assert float(settings["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"]) == stop
    margin = float(settings["SHUTDOWN_COORDINATOR_SAFETY_MARGIN_S"])
    assert 5 <= margin < stop
    assert value(engine, "Service", "KillMode") == "mixed"


def test_engine_stop_runs_the_drain_through_its_coordinator(
    engine: Unit, coordinator: Unit, settings: dict[str, str]
) -> None:
    """1. ExecStop is `shutdown-coordinator drain`.
    2. The engine is ordered after the coordinator (so stopped before it) and wants it.
    3. URL and token file point at this coordinator and at the same token credential.
    """
    argv = shlex.split(value(engine, "Service", "ExecStop"))
    assert argv[:2] == [CLI, "drain"]
    assert "shutdown-coordinator.service" in values(engine, "Unit", "After")
    assert "shutdown-coordinator.service" in values(engine, "Unit", "Wants")
    env = environment(engine)
    assert env["SHUTDOWN_COORDINATOR_URL"] == (
        f"http://127.0.0.1:{settings['SHUTDOWN_COORDINATOR_PORT']}"
    )
    name, _, source = value(engine, "Service", "LoadCredential").partition(":")
    assert env["SHUTDOWN_COORDINATOR_TOKEN_FILE"] == f"%d/{name}"
    own_name, _, own_source = value(coordinator, "Service", "LoadCredential").partition(":")
    assert source == own_source
    assert f"--token-file=%d/{own_name}" in value(coordinator, "Service", "ExecStart")


def test_coordinator_can_signal_the_engine_and_nothing_else(
    engine: Unit, coordinator: Unit, settings: dict[str, str]
) -> None:
    """1. Same User= as the engine and no capability at all.
    2. It can see the engine's /proc entries (no ProtectProc=invisible, no ProcSubset=pid).
    3. Its state file lives in its StateDirectory (writable under ProtectSystem=strict).
    4. Stopped on its own, it waits out a drain in progress (longer TimeoutStopSec).
    """
    assert value(coordinator, "Service", "User") == value(engine, "Service", "User")
    assert value(coordinator, "Service", "CapabilityBoundingSet") == ""
    assert not values(coordinator, "Service", "AmbientCapabilities")
    assert values(coordinator, "Service", "ProtectProc") in ([], ["default"])
    assert not values(coordinator, "Service", "ProcSubset")
    state_dir = Path("/var/lib") / value(coordinator, "Service", "StateDirectory")
    assert Path(settings["SHUTDOWN_COORDINATOR_STATE_FILE"]).parent == state_dir
    assert seconds(value(coordinator, "Service", "TimeoutStopSec")) > seconds(
        value(engine, "Service", "TimeoutStopSec")
    )
    assert value(coordinator, "Service", "Restart") == "always"


def _staged_units(tmp: Path) -> tuple[Path, dict[str, str]]:
    """The units in a scratch unit directory, absolute commands replaced by stubs (verify
    checks that every command exists and is executable on this machine)."""
    units = tmp / "units"
    bin_dir = tmp / "bin"
    (units / "sglang.service.d").mkdir(parents=True)
    bin_dir.mkdir()
    stubs = {CLI: str(bin_dir / "shutdown-coordinator"), "/opt/sglang/bin/python": sys.executable}
    stub = Path(stubs[CLI])
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)

    def copy(source: Path, target: Path) -> None:
        text = source.read_text()
        for real, fake in stubs.items():
            text = text.replace(real, fake)
        target.write_text(text)

    copy(COORDINATOR_UNIT, units / COORDINATOR_UNIT.name)
    copy(ENGINE_UNIT, units / ENGINE_UNIT.name)
    copy(DROP_IN, units / "sglang.service.d" / "shutdown-coordinator.conf")
    return units, stubs


def _verify(units: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None
    return subprocess.run(
        [analyze, "verify", "--man=no", "sglang.service", "shutdown-coordinator.service"],
        cwd=units,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


@needs_analyze
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """1. Stage the coordinator unit, the engine unit and the drop-in in a unit directory.
    2. `systemd-analyze verify` both units (the drop-in is loaded with the engine's).
    3. No error, no warning.
    """
    units, _ = _staged_units(tmp_path)
    done = _verify(units)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


@needs_analyze
def test_verify_catches_a_broken_drop_in(tmp_path: Path) -> None:
    """1. Stage the units with a misspelt KillMode in the drop-in.
    2. `systemd-analyze verify` complains, so the clean result above means something.
    """
    units, _ = _staged_units(tmp_path)
    drop_in = units / "sglang.service.d" / "shutdown-coordinator.conf"
    drop_in.write_text(drop_in.read_text().replace("KillMode=mixed", "KillMode=mixd"))
    done = _verify(units)
    assert "mixd" in done.stderr


@pytest.mark.parametrize(
    ("engine_args", "stop_code", "main_status"),
    [(("--graceful-main",), exit_codes.OK, 0),
     ((), exit_codes.SIGNALLED, -signal.SIGKILL)],
    ids=["graceful-main", "stock-sglang-sigkills-itself"],
)
def test_exec_stop_drains_the_engine_through_the_real_coordinator(
    janitor: ProcessJanitor, tmp_path: Path, engine: Unit, engine_args: tuple[str, ...],
    stop_code: int, main_status: int,
) -> None:
    """1. Start a simulated engine (one whose main process exits 0 on SIGTERM, or one that
       SIGKILLs itself as stock SGLang does) and a coordinator (token file, adopting it).
    2. Run the drop-in's ExecStop as systemd would: its command line with the unit's
       Environment= applied and %d pointing at the credentials directory.
    3. It exits 0 only when the engine's main process really exited 0 (its wait status),
       and every process of the engine, its main process included, is gone before systemd's
       own SIGTERM.
    """
    ready = tmp_path / "engine.json"
    records = tmp_path / "records"
    records.mkdir()
    main = janitor.spawn_python(
        [
            *("-m", "devstack.sim", "--port", "0", "--ready-file", str(ready)),
            *("--record-dir", str(records), "--schedulers", "2", "--no-watchdog"),
            *engine_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    info = wait_for(lambda: ready.exists() and json.loads(ready.read_text()), what="engine ready")
    running = start_coordinator(
        janitor, tmp_path, *FAST, "--adopt-pid", str(info["pid"]), token="unit-token"
    )
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    name = value(engine, "Service", "LoadCredential").partition(":")[0]
    (credentials / name).write_text("unit-token\n")
    env = {k: v.replace("%d", str(credentials)) for k, v in environment(engine).items()}
    env["SHUTDOWN_COORDINATOR_URL"] = running.url
    argv = shlex.split(value(engine, "Service", "ExecStop"))
    assert argv[0] == CLI
    stop = janitor.spawn(
        [sys.executable, "-m", "coordinator", *argv[1:]],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = stop.communicate(timeout=60)
    assert main.wait(timeout=60) == main_status
    assert stop.returncode == stop_code, out.decode() + running.log.read_text()
    pids = {info["pid"], *(p["pid"] for p in info["processes"])}
    assert len(pids) == 4  # the main process, two schedulers, the detokenizer
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
