"""``shutdown-coordinator run`` started by a test: its process, its log, its last line.

The wrapper is started through the janitor in a session of its own (so the test can signal
its process group), with budgets small enough for a test, on a free loopback port; its
stderr (the log) and stdout (the engine's) go to files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devstack.sim import EngineKnobs
from devstack.sim.records import read_records
from tests.service.servers import ROOT
from tests.support.processes import ProcessJanitor, wait_for

FAST = ["--grace-period", "30", "--safety-margin", "2", "--tier-timeout", "10",
        "--confirm-timeout", "2", "--prekill-timeout", "2", "--scan-interval", "0.5"]
"""Budgets a test's drain fits in; no tier waits its whole timeout in a passing test."""
EXIT_S = 90.0
"""Bounds a wrapper that should have exited (never reached by a passing test)."""
SUMMARY = "engine init end: "
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def logfmt_fields(text: str) -> dict[str, Any]:
    """``key=value`` pairs (``coordinator.logfmt``): quoted values are JSON strings, ``-``
    is None."""
    out: dict[str, Any] = {}
    for key, value in _FIELD.findall(text):
        out[key] = json.loads(value) if value.startswith('"') else (
            None if value == "-" else value)
    return out


PROCESS_MARKERS = ("drain process: ", "left behind: ")
"""``run``'s own line for each process it ended: in the drain, or after the engine."""
DRAIN_END = "drain end: "


@dataclass
class RunLog:
    """What ``run`` logged of how it ended: its summary (which must be the last line), the
    drain's own end line, and its line for each process it ended, by PID."""

    summary: dict[str, Any] | None
    drain: dict[str, Any] | None
    processes: dict[int, dict[str, Any]]


def read_run_log(text: str) -> RunLog:
    """``run``'s end in its log (``coordinator.logfmt`` lines among the engine's own)."""
    lines = text.strip().splitlines()
    summary = (logfmt_fields(lines[-1].split(SUMMARY, 1)[1])
               if lines and SUMMARY in lines[-1] else None)
    drain = None
    processes: dict[int, dict[str, Any]] = {}
    for line in lines:
        if DRAIN_END in line:
            drain = logfmt_fields(line.split(DRAIN_END, 1)[1])
        for marker in PROCESS_MARKERS:
            if marker in line:
                fields = logfmt_fields(line.split(marker, 1)[1])
                processes[int(fields["pid"])] = fields
    return RunLog(summary, drain, processes)


@dataclass
class Wrapper:
    """One ``run`` process."""

    proc: subprocess.Popen[Any]
    tmp: Path
    log: Path
    out: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self) -> str:
        port_file = self.tmp / "port.json"
        data = wait_for(lambda: port_file.exists() and json.loads(port_file.read_text()),
                        what="the wrapper's port file")
        return str(data["url"])

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.url() + "/status", timeout=30).json()
        return data

    def wait(self, timeout: float = EXIT_S) -> int:
        return self.proc.wait(timeout=timeout)

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def summary(self) -> dict[str, Any]:
        """The fields of the summary, which must be the log's last line."""
        last = self.lines()[-1]
        assert SUMMARY in last, self.log.read_text()
        return logfmt_fields(last.split(SUMMARY, 1)[1])


def start_wrapper(janitor: ProcessJanitor, tmp: Path, command: Sequence[str], *flags: str,
                  env: dict[str, str] | None = None, shell_prefix: str = "") -> Wrapper:
    """Start ``run [FAST] [flags] -- command``; ``shell_prefix`` runs it through ``sh -c``
    after that text (``printf x |`` feeds its stdin)."""
    tmp.mkdir(parents=True, exist_ok=True)
    log, out = tmp / "wrapper.log", tmp / "wrapper.out"
    argv = [sys.executable, "-m", "coordinator", "run", "--port", "0", "--port-file",
            str(tmp / "port.json"), *FAST, *flags, "--", *command]
    if shell_prefix:
        import shlex

        argv = ["sh", "-c", f"{shell_prefix} exec {shlex.join(argv)}"]
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = janitor.spawn(argv, cwd=ROOT, env=env, stdout=stdout, stderr=err)
    return Wrapper(proc, tmp, log, out)


def sim_command(tmp: Path, knobs: EngineKnobs, *, register: bool = False) -> list[str]:
    """The simulated engine's command line (its records and ready file under ``tmp``);
    ``register``: through ``worker_client``, with the wrapper's URL from its environment."""
    argv = [sys.executable, "-m", "devstack.sim", "--record-dir", str(tmp / "records"),
            "--ready-file", str(tmp / "ready.json"), *knobs.to_argv()]
    if register:
        return ["sh", "-c", 'exec "$@" --coordinator "$SHUTDOWN_COORDINATOR_URL"', "sh", *argv]
    return argv


def sim_ready(tmp: Path, wrapper: Wrapper) -> dict[str, Any]:
    """The simulated engine's ready file, once written (fails at once if the wrapper ends)."""
    ready = tmp / "ready.json"

    def written() -> Any:
        if wrapper.proc.poll() is not None:
            raise AssertionError(f"the wrapper exited {wrapper.proc.returncode}: "
                                 f"{wrapper.log.read_text()}")
        return ready.exists() and json.loads(ready.read_text())

    data: dict[str, Any] = wait_for(written, timeout=120, what="the simulated engine ready")
    return data


def records(tmp: Path) -> dict[int, dict[str, Any]]:
    return {r["pid"]: r for r in read_records(tmp / "records")}
