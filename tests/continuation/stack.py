"""Processes of the continuation tests: the proxy, and the small upstreams it is put in
front of (a round-robin router over simulated engines, a scripted one), each started through
the test's janitor as a service, its address read from its ready file."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proxy:
    """A running ``python -m continuation_proxy``."""

    proc: subprocess.Popen[Any]
    url: str
    log: Path

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"name{labels}": value}``."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _start(janitor: ProcessJanitor, tmp: Path, name: str, args: list[str],
           exit_code: int) -> tuple[subprocess.Popen[Any], str, Path]:
    ready = tmp / f"{name}.json"
    log = tmp / f"{name}.log"
    with log.open("ab") as out:
        proc = janitor.spawn_python([*args, "--ready-file", str(ready)], cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, service=True,
                                    exit_code=exit_code)

    def up() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}: {log.read_text()}")
        return str(json.loads(ready.read_text())["url"]) if ready.exists() else None

    url: str = wait_for(up, what=f"{name} listening")
    return proc, url, log


def start_proxy(janitor: ProcessJanitor, tmp: Path, upstream: str, *args: str,
                name: str = "proxy") -> Proxy:
    """The proxy in front of ``upstream``; a service that must exit 0 on SIGTERM."""
    proc, url, log = _start(janitor, tmp, name, [
        "-m", "continuation_proxy", "--upstream", upstream, "--port", "0",
        "--log-level", "info", *args], exit_code=0)
    return Proxy(proc, url, log)


def start_round_robin(janitor: ProcessJanitor, tmp: Path, workers: list[str]) -> str:
    """The round-robin router over ``workers``; its URL. uvicorn re-raises the SIGTERM it
    stopped on, so its declared exit is that signal."""
    argv = ["-m", "tests.continuation.round_robin"]
    for worker in workers:
        argv += ["--worker", worker]
    return _start(janitor, tmp, "round-robin", argv, exit_code=-signal.SIGTERM)[1]


def start_scripted(janitor: ProcessJanitor, tmp: Path) -> str:
    """The scripted upstream (a tool call, then handed back); its URL."""
    return _start(janitor, tmp, "scripted", ["-m", "tests.continuation.scripted_upstream"],
                  exit_code=-signal.SIGTERM)[1]
