"""Pods (a coordinator and a simulated engine each), the reference router, streaming clients."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.sim.launcher import EngineHandle, start_engine
from devstack.streaming_load import StreamingLoad
from tests.kill.helpers import alive
from tests.service.servers import FAST, Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[2]
ENGINE = {"schedulers": 1, "token_interval_ms": 40.0, "graceful_main": True}
"""One scheduler and a detokenizer under each main process: a real tree, light on 2 cores."""
NO_COORDINATOR = "http://127.0.0.1:9"
"""Where the router looks for the coordinator of a pod that has none (nothing listens)."""


@dataclass
class Pod:
    """One pod: its coordinator (None for the no-coordinator baseline) and its engine."""

    engine: EngineHandle
    coordinator: Running | None

    @property
    def coordinator_url(self) -> str:
        return self.coordinator.url if self.coordinator else NO_COORDINATOR


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_pod(
    janitor: ProcessJanitor, tmp: Path, name: str, *coordinator_args: str,
    with_coordinator: bool = True, **engine: Any,
) -> Pod:
    """A coordinator and an engine registered with it (waits for the registration)."""
    running = None
    knobs = {**ENGINE, **engine}
    if with_coordinator:
        running = start_coordinator(janitor, tmp, *FAST, *coordinator_args, name=f"{name}-c")
        knobs["coordinator"] = running.url
    handle = start_engine(janitor.spawn, tmp / f"{name}-records", **knobs)
    pod = Pod(handle, running)
    if running is not None:
        wait_for(lambda: registered(pod), what=f"{name}'s engine registered")
    return pod


def registered(pod: Pod) -> bool:
    assert pod.coordinator is not None
    workers = pod.coordinator.status()["workers"]
    return any(w["pid"] == pod.engine.pid and w.get("connected") for w in workers)


def start_router(janitor: ProcessJanitor, tmp: Path, pods: list[Pod], *args: str) -> str:
    """The reference router over ``pods``; returns its URL."""
    ready = tmp / "router.json"
    log = (tmp / "router.log").open("ab")
    workers: list[str] = []
    for pod in pods:
        workers += ["--worker", f"{pod.engine.url}={pod.coordinator_url}"]
    proc = janitor.spawn_python(
        ["-m", "devstack.reference_router", "--port", "0", "--ready-file", str(ready),
         *workers, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        # A service: uvicorn re-raises the SIGTERM it stopped on.
        service=True, exit_code=-signal.SIGTERM,
    )
    log.close()

    def up() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"router exited {proc.returncode}")
        return str(json.loads(ready.read_text())["url"]) if ready.exists() else None

    url: str = wait_for(up, what="router listening")
    return url


class Load(StreamingLoad):
    """``n`` concurrent streaming completions; ``started`` fires once each has ``min_tokens``."""

    def __init__(self, url: str, n: int, max_tokens: int, min_tokens: int = 3) -> None:
        super().__init__(url, [f"prompt {i}: tell me" for i in range(n)], max_tokens,
                         request_id_prefix="client-", warm_tokens=min_tokens, timeout_s=60.0)

    @property
    def started(self) -> asyncio.Event:
        return self.flowing


def summary_is_graceful(summary: dict[str, Any], main_pid: int) -> list[str]:
    """What is wrong with how a drain summary says the processes ended (empty when every
    process ended gracefully and the main process, the test's own child and so a zombie
    the coordinator can read until the test waits for it, is listed once with exit code
    0). The outcome is the caller's to check: it also judges the migrations."""
    wrong = [f"{p['pid']} {p['name']}: {p['fate']}" for p in summary["processes"]
             if p["fate"] not in ("exited", "gone")]
    main = [p for p in summary["processes"] if p["pid"] == main_pid]
    if len(main) != 1 or main[0]["exit_code"] != 0:
        wrong.append(f"main process: {main}")
    return wrong


def assert_true_to_the_records(summary: dict[str, Any], engine: EngineHandle,
                               main_code: int) -> None:
    """The drain summary says what the simulated engine's processes say of themselves: each
    one listed once (and nothing else), none still running (/proc), every one finished its
    cleanup (its own end record) and exited with the code it recorded, the main process
    with its wait status ``main_code``."""
    records = {int(r["pid"]): r for r in engine.records()}
    listed = {int(p["pid"]): p for p in summary["processes"]}
    pids = {p.pid for p in engine.processes}
    assert len(summary["processes"]) == len(listed) == len(records) == len(pids)
    assert set(listed) == set(records) == pids
    assert not [pid for pid in pids if alive(pid)]
    assert records[engine.pid]["exit_code"] == main_code
    for pid, record in records.items():
        assert (record["cleanup"], record["signal"]) == ("finished", "SIGTERM"), record
        assert (listed[pid]["fate"], listed[pid]["exit_code"]) == (
            "exited", record["exit_code"]), (listed[pid], record)
