"""The same engine as a container's main process under each init, stopped as a runtime stops
it: ``podman stop -t GRACE`` (the stop signal to PID 1, SIGKILL GRACE seconds later).

    python -m tests.init.side_by_side [--grace S]     prints the table (docs/deploy.md)

The engine is the simulated SGLang-shaped tree with the upstream fix (two schedulers and a
detokenizer with ``PR_SET_PDEATHSIG``, a child watchdog; on SIGTERM its main process serves
its open streams to their end, then stops its children and exits 0), and two things real
engines do that an init must handle:

- a daemon a child started (double fork and ``setsid``: its own session and group, no
  PDEATHSIG), which only SIGTERM ends cleanly;
- a short-lived orphan (``sh -c '(sleep 0.1 &); exec ENGINE'``): whoever is PID 1 must reap
  it, or it stays a zombie.

One stream is in flight when the stop comes: ``short`` ends inside the grace period on its
own; ``long`` outlives any grace period (the engine holds it after 5 tokens until it is
handed back, as a 14-minute generation would run on).

Every measure comes from outside the init: the exit code podman records, each process's own
end record (``devstack.sim.records``), the zombies in the container's PID namespace read
from ``/proc`` just before the stop, the stream as the client received it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack.routers import free_port
from devstack.sim.records import read_records
from tests.init.containers import INIT_LABEL, mounts, namespace_states, remove
from tests.pods.images import Images
from tests.pods.podman import Podman

VENV_BIN = Path(sys.executable).parent
PYTHON = str(VENV_BIN / "python")
DUMB_INIT = str(VENV_BIN / "dumb-init")
TINI = "/usr/bin/tini"
GRACE_S = 12
HOLD_AT = 5
SHORT_TOKENS = 150
TOKEN_INTERVAL_MS = 20
READY_S = 120.0

INITS: dict[str, Callable[[list[str], list[str]], list[str]]] = {
    "run (worker_client)": lambda engine, flags: [PYTHON, "-m", "coordinator", "run",
                                                  *flags, "--", *engine],
    "run (--engine sglang)": lambda engine, flags: [PYTHON, "-m", "coordinator", "run",
                                                    *flags, "--", *engine],
    "tini": lambda engine, _flags: [TINI, "--", *engine],
    "tini -g": lambda engine, _flags: [TINI, "-g", "--", *engine],
    "dumb-init": lambda engine, _flags: [DUMB_INIT, *engine],
    "no init": lambda engine, _flags: engine,
}
"""How each init is the container's command around the engine's."""
REGISTERS = {"run (worker_client)"}
"""Inits under which the engine registers through ``worker_client`` (the others adopt it or
know nothing of it)."""


@dataclass
class Stream:
    """A streaming completion read on a thread: how it ended."""

    tokens: int = 0
    how: str = "open"
    """``whole`` ([DONE] after every token), ``handed back`` (its hand-back event),
    ``cut`` (the connection ended first)."""
    handed_back: dict[str, Any] | None = None
    started: threading.Event = field(default_factory=threading.Event)


def read_stream(url: str, max_tokens: int, stream: Stream,
                on_hand_back: Callable[[dict[str, Any]], None]) -> None:
    try:
        with httpx.Client(timeout=httpx.Timeout(10, read=None)) as client, client.stream(
                "POST", url + "/v1/completions",
                json={"prompt": "Stop me:", "max_tokens": max_tokens, "stream": True},
                headers={"X-Request-Id": f"side-by-side-{uuid.uuid4().hex[:8]}"}) as reply:
            for line in reply.iter_lines():
                if line == "data: [DONE]":
                    stream.how = "whole" if stream.tokens == max_tokens else "short"
                    return
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("handed_back"):
                    stream.handed_back = event
                    stream.how = "handed back"
                    on_hand_back(event)
                    return
                stream.tokens += 1
                if stream.tokens >= HOLD_AT:
                    stream.started.set()
    except httpx.HTTPError:
        pass
    finally:
        if stream.how == "open":
            stream.how = "cut"
        stream.started.set()


def pid_namespace_states(init_pid: int) -> list[str]:
    """The state letter of every process in ``init_pid``'s PID namespace (from the host)."""
    return [state for state, _ in namespace_states(init_pid).values()]


def fate(record: dict[str, Any]) -> str:
    """How a process ended, by its own record."""
    if record["ended_at"] is not None:
        code = record["exit_code"]
        return "exited 0" if code == 0 else f"ended {code}"
    if record["signal"] is None:
        return "killed, never signalled"
    if record["cleanup"] == "started":
        return "killed mid-cleanup"
    return f"killed after {record['signal']}"


@dataclass
class Row:
    init: str
    stream_kind: str
    exit_code: int
    fates: dict[str, list[str]]
    """Role → the fate of each process of that role."""
    zombies: int
    stream: str
    stream_tokens: int
    stop_s: float
    records: list[dict[str, Any]]

    def processes(self) -> str:
        counted: dict[str, int] = {}
        for role, fates in sorted(self.fates.items()):
            for one in fates:
                counted[f"{role} {one}"] = counted.get(f"{role} {one}", 0) + 1
        return "; ".join(f"{n} {what}" if n > 1 else what for what, n in counted.items())

    def markdown(self) -> str:
        return (f"| {self.init} | {self.stream_kind} | {self.exit_code} | {self.processes()} "
                f"| {self.zombies} | {self.stream} ({self.stream_tokens} tokens) "
                f"| {self.stop_s:.1f} s |")


def engine_command(records: Path, port: int, *, register: bool) -> list[str]:
    sim = [PYTHON, "-m", "devstack.sim", "--host", "127.0.0.1", "--port", str(port),
           "--record-dir", str(records), "--ready-file", str(records / "ready.json"),
           "--schedulers", "2", "--teardown-s", "0.5", "--token-interval-ms",
           str(TOKEN_INTERVAL_MS), "--serve-open-streams-s", "600", "--hold-after-tokens",
           str(SHORT_TOKENS + 1), "--daemonize", "detokenizer"]
    tail = ' --coordinator "$SHUTDOWN_COORDINATOR_URL"' if register else ""
    return ["sh", "-c", f'(sleep 0.1 &); exec "$@"{tail}', "sh", *sim]


def wrapper_flags(init: str, records: Path, port: int, grace_s: int) -> list[str]:
    flags = ["--port", "0", "--port-file", str(records / "coordinator.json"),
             "--grace-period", str(grace_s), "--safety-margin", "2", "--tier-timeout", "5",
             "--confirm-timeout", "1"]
    if init == "run (--engine sglang)":
        flags += ["--engine", "sglang", "--engine-metrics-url",
                  f"http://127.0.0.1:{port}/metrics"]
    return flags


def _wait(predicate: Callable[[], Any], what: str, timeout: float = READY_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def run_one(podman: Podman, images: Images, init: str, stream_kind: str, scratch: Path,
            grace_s: int = GRACE_S) -> Row:
    """1. Start the engine under ``init`` as the container's command; wait until it serves
       (and, under the worker_client variant, has registered).
    2. Open a stream; once it has streamed its first tokens, ``podman stop -t GRACE``.
    3. Collect: podman's exit code, every end record, the zombies seen before the stop, how
       the stream ended (a handed-back one is acknowledged, as a router does once it
       continues it elsewhere)."""
    records = scratch / "records"
    records.mkdir(parents=True)
    port = free_port()
    register = init in REGISTERS
    engine = engine_command(records, port, register=register)
    argv = INITS[init](engine, wrapper_flags(init, records, port, grace_s))
    name = f"init-{uuid.uuid4().hex[:10]}"
    podman.run("run", "-d", "--name", name, *podman.labels(INIT_LABEL), "--network", "host",
               "--workdir", str(records), *mounts(records), images.base(), *argv)
    try:
        state = podman.inspect(name)["State"]
        ready = _wait(lambda: (records / "ready.json").exists() and json.loads(
            (records / "ready.json").read_text()), f"the engine under {init}")
        coordinator = None
        if init.startswith("run"):
            coordinator = _wait(lambda: (records / "coordinator.json").exists() and json.loads(
                (records / "coordinator.json").read_text())["url"], "the coordinator")
        if register:
            _wait(lambda: httpx.get(f"{coordinator}/status", timeout=10).json()["workers"],
                  "the engine's registration")
        daemon = next(p["pid"] for p in ready["processes"] if p["role"] == "daemon")
        _wait(lambda: (records / f"daemon-{daemon}.json").exists(), "the daemon's record")

        def ack(event: dict[str, Any]) -> None:
            if coordinator is not None:
                httpx.post(f"{coordinator}/migrations/ack", timeout=10,
                           json={"request_ids": [event["request_id"]]})

        stream = Stream()
        tokens = SHORT_TOKENS if stream_kind == "short" else SHORT_TOKENS + 100
        reader = threading.Thread(target=read_stream, daemon=True,
                                  args=(ready["url"], tokens, stream, ack))
        reader.start()
        stream.started.wait(READY_S)
        zombies = pid_namespace_states(state["Pid"]).count("Z")
        started = time.monotonic()
        podman.run("stop", "-t", str(grace_s), name, timeout=grace_s + COMMAND_SLACK_S)
        stop_s = time.monotonic() - started
        reader.join(READY_S)
        exit_code = int(podman.inspect(name)["State"]["ExitCode"])
    finally:
        remove(podman, name)
    found = read_records(records)
    fates: dict[str, list[str]] = {}
    for record in found:
        fates.setdefault(record["role"], []).append(fate(record))
    return Row(init, stream_kind, exit_code, fates, zombies, stream.how, stream.tokens,
               stop_s, found)


COMMAND_SLACK_S = 120.0


def table(rows: Sequence[Row]) -> str:
    head = ("| init | stream | exit code (podman) | every process, by its own record "
            "| zombies before the stop | the stream | podman stop took |\n"
            "| --- | --- | --- | --- | --- | --- | --- |")
    return "\n".join([head, *(row.markdown() for row in rows)])


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grace", type=int, default=GRACE_S)
    parser.add_argument("--inits", nargs="*", default=list(INITS))
    parser.add_argument("--streams", nargs="*", default=["short", "long"])
    args = parser.parse_args(argv)
    podman = Podman()
    podman.prepare()
    podman.remove_leftovers()
    images = Images(podman)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch:
        for stream_kind in args.streams:
            for init in args.inits:
                row = run_one(podman, images, init, stream_kind,
                              Path(scratch) / f"{stream_kind}-{len(rows)}", args.grace)
                print(row.markdown(), flush=True)
                rows.append(row)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
