"""A real engine under each init, stopped as a runtime stops its main process, every process's
end read from the kernel through ``strace``.

    python -m tests.init.real_engines vllm [--inits ...]     prints the table (docs/deploy.md)

The init is started under ``strace -f -q -e trace=kill,tgkill,pidfd_send_signal`` (only the
calls that send signals are traced; signals delivered and process ends are reported for the
init and everything it and its children start), so each process's record is the kernel's:
which signals it received and from which PID, which it sent, and ``exited with N`` or
``killed by SIG…``. ``strace`` is the init's parent, never between it
and the engine. The stop is what ``podman stop -t GRACE`` does to a container's PID 1:
SIGTERM to the init, SIGKILL to it GRACE seconds later if it is still there. One stream is in
flight when the stop comes; it would end inside the grace period on its own.

On the host the inits are not PID 1: tini runs with ``-s`` (a subreaper, as PID 1 would
reap), dumb-init as it is; ``tests.init.real_containers`` runs the same engines with each
init as a podman container's PID 1 (zombies, the runtime's exit code, the namespace's end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from devstack.routers import free_port
from tests.engines.stack import tree
from tests.engines.tiny_model import prompt, write_tiny_model
from tests.init.wrapper import read_run_log

ENGINES = Path(os.environ.get("ENGINES_DIR", Path(__file__).resolve().parents[2] / ".engines"))
VENV_BIN = Path(sys.executable).parent
GRACE_S = 120
"""The overlays' terminationGracePeriodSeconds."""
START_S = 1800.0
"""Bound on an engine's start: vLLM's takes about a minute on 2 idle cores, over fifteen
on this machine under a load of 20."""
MAX_TOKENS = 200

INITS: dict[str, Callable[[list[str], list[str]], list[str]]] = {
    "run": lambda engine, flags: [sys.executable, "-m", "coordinator", "run", *flags, "--",
                                  *engine],
    "tini": lambda engine, _f: ["tini", "-s", "--", *engine],
    "tini -g": lambda engine, _f: ["tini", "-s", "-g", "--", *engine],
    "dumb-init": lambda engine, _f: [str(VENV_BIN / "dumb-init"), *engine],
    "no init": lambda engine, _f: engine,
}
_LINE = re.compile(r"^(\d+)\s+(?:--- (SIG\w+) \{(.*)\} ---|\+\+\+ (exited with (\d+)|killed by "
                   r"(SIG\w+))(?: \(core dumped\))? \+\+\+)$")
_SENT = re.compile(r"^(\d+)\s+(kill|tgkill|pidfd_send_signal)\(([^)]*?)"
                   r"(?:\)\s+=\s+(?:0|\?)|\s*<unfinished \.\.\.>)")
"""A signal-sending call that succeeded, or that never returned: a process's SIGKILL to
itself (``kill(6, SIGKILL <unfinished ...>``, or ``= ?``)."""
TRACED = "trace=kill,tgkill,pidfd_send_signal"
"""The signal-sending system calls: who sent what (a SIGKILL cannot be caught, so its sender
is read from the call)."""


@dataclass
class Traced:
    """One process as the kernel told strace."""

    pid: int
    received: list[tuple[str, int | None]] = field(default_factory=list)
    """Signals delivered to it, each with the PID that sent it (None: the kernel)."""
    end: str | None = None
    """``exited 0``, ``killed by SIGKILL``; None if it never ended while traced."""
    sent: list[tuple[str, str, str]] = field(default_factory=list)
    """Signals it sent: (system call, target as the call names it, signal)."""


def wait_status(end: str | None) -> int | None:
    """``exited 3`` → 3, ``killed by SIGKILL`` → -9 (``subprocess``'s convention)."""
    if end is None:
        return None
    if end.startswith("exited "):
        return int(end.removeprefix("exited "))
    return -int(signal.Signals[end.removeprefix("killed by ")])


def parse_strace(path: Path) -> dict[int, Traced]:
    found: dict[int, Traced] = {}
    for line in path.read_text(errors="replace").splitlines():
        sent = _SENT.match(line.strip())
        if sent is not None:
            args = [a.strip() for a in sent.group(3).split(",")]
            sig = next((a for a in args if a.startswith("SIG")), "?")
            found.setdefault(int(sent.group(1)), Traced(int(sent.group(1)))).sent.append(
                (sent.group(2), args[0], sig))
            continue
        match = _LINE.match(line.strip())
        if match is None:
            continue
        pid = int(match.group(1))
        traced = found.setdefault(pid, Traced(pid))
        if match.group(2):
            sender = re.search(r"si_pid=(\d+)", match.group(3))
            traced.received.append((match.group(2), int(sender.group(1)) if sender else None))
        elif match.group(5) is not None:
            traced.end = f"exited {match.group(5)}"
        else:
            traced.end = f"killed by {match.group(6)}"
    return found


def vllm_command(model: Path, port: int) -> list[str]:
    """vLLM's OpenAI server on the tiny model (as tests/engines start it), with its own
    graceful wait on (``--shutdown-timeout``), as the shipped overlays run it."""
    python = ENGINES / "vllm" / "bin" / "python"
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny", "--load-format", "dummy", "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(256 * 2**20), "--host", "127.0.0.1", "--port",
            str(port), "--shutdown-timeout", "30"]


SGLANG_CPU = ("--device", "cpu", "--load-format", "dummy", "--attention-backend",
              "torch_native", "--sampling-backend", "pytorch", "--dtype", "float32",
              "--mem-fraction-static", "0.1", "--max-total-tokens", "8192",
              "--skip-server-warmup", "--disable-radix-cache", "--enable-metrics")
"""What SGLang 0.5.23 needs on this CPU, with the out-of-tree CPU platform installed in its
virtualenv (``sglang_cpu_platform``, scripts/engines.sh sglang)."""


def sglang_command(model: Path, port: int) -> list[str]:
    python = ENGINES / "sglang" / "bin" / "python"
    return [str(python), "-m", "sglang.launch_server", "--model-path", str(model),
            "--served-model-name", "tiny", *SGLANG_CPU, "--host", "127.0.0.1", "--port",
            str(port)]


COMMANDS = {"vllm": vllm_command, "sglang": sglang_command}


@dataclass
class Stream:
    tokens: int = 0
    finish: str | None = None
    how: str = "open"
    first: threading.Event = field(default_factory=threading.Event)


def read_stream(url: str, stream: Stream) -> None:
    body = {"model": "tiny", "prompt": prompt(6), "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    try:
        with httpx.Client(timeout=httpx.Timeout(30, read=None)) as client, client.stream(
                "POST", url + "/v1/completions", json=body) as reply:
            for line in reply.iter_lines():
                if line == "data: [DONE]":
                    stream.how = "whole" if (stream.finish == "length"
                                             and stream.tokens == MAX_TOKENS) else (
                        f"ended early ({stream.tokens} of {MAX_TOKENS} tokens, "
                        f"{stream.finish})")
                    return
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    stream.finish = choice.get("finish_reason") or stream.finish
                    stream.first.set()
                if chunk.get("usage"):
                    stream.tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError:
        pass
    finally:
        if stream.how == "open":
            stream.how = "cut"
        stream.first.set()


@dataclass
class Row:
    init: str
    init_pid: int
    main_pid: int
    """The engine's main process: the init's child."""
    exit_code: str
    processes: dict[int, tuple[str, Traced]]
    """PID → (its name before the stop, what the kernel said)."""
    left_running: list[int]
    stream: str
    stop_s: float
    summary: dict[str, Any] | None
    init_sent: list[tuple[str, str, str]]
    """What the init itself sent: (system call, target, signal)."""
    reported: dict[int, dict[str, Any]]
    """``run``'s own log line for each process (``drain process:``, ``left behind:``)."""

    def fates(self) -> str:
        parts = []
        for pid, (name, traced) in sorted(self.processes.items()):
            got = ",".join(sorted({sig for sig, _ in traced.received if sig != "SIGCHLD"}))
            shown = f"{name} (main)" if pid == self.main_pid else name
            parts.append(f"{shown}: {got or 'no signal'} → {traced.end or 'running'}")
        return "; ".join(parts)

    def sent(self) -> str:
        """What the init sent, by call: ``kill(-123)`` is a process group."""
        if not self.init_sent:
            return "nothing" if self.init != "no init" else "-"
        return ", ".join(f"{sig} by {call}({target})" for call, target, sig in self.init_sent)

    def markdown(self) -> str:
        left = len(self.left_running)
        return (f"| {self.init} | {self.exit_code} | {self.sent()} | {self.fates()} | {left} "
                f"| {self.stream} | {self.stop_s:.1f} s |")


def _named(pid: int) -> dict[int, str]:
    """PID → name (an engine's process title where it set one) of ``pid`` and below."""
    return {p: name[:24] for p, name in tree(pid).items()}


def _health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def run_one(init: str, engine: list[str], engine_url: str, scratch: Path,
            spawn: Callable[..., subprocess.Popen[Any]], flags: Sequence[str] = (),
            grace_s: int = GRACE_S) -> Row:
    """1. Start the init under strace with the engine's command; wait until it is healthy.
    2. Open a stream; at its first token, SIGTERM the init; SIGKILL it ``grace_s`` later if
       it is still there (as ``podman stop -t``).
    3. Collect: the init's exit from the kernel, every process's signals and end, what is
       still running after the init is gone, how the stream ended, ``run``'s summary."""
    scratch.mkdir(parents=True, exist_ok=True)
    trace = scratch / "strace.log"
    log = scratch / "init.log"
    # --seccomp-bpf: the tree stops for strace only at the traced calls and at signals, not
    # at every call it makes (without it, a CI run's vLLM Worker had 19.9 s of system time
    # and its exit outlasted the 20 s EngineCore gives it).
    argv = ["strace", "-f", "--seccomp-bpf", "-q", "-e", TRACED, "-o", str(trace), "--",
            *INITS[init](engine, list(flags))]
    with log.open("wb") as out:
        tracer = spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_S
    while not _health(engine_url):
        if tracer.poll() is not None:
            raise AssertionError(f"{init}: exited {tracer.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{init}: the engine never became healthy")
        time.sleep(0.5)
    (init_pid,) = [c.pid for c in psutil.Process(tracer.pid).children()]
    main_pid = init_pid if init == "no init" else min(
        c.pid for c in psutil.Process(init_pid).children())
    names = _named(init_pid)
    (scratch / "names.json").write_text(json.dumps(names))
    stream = Stream()
    reader = threading.Thread(target=read_stream, args=(engine_url, stream), daemon=True)
    reader.start()
    stream.first.wait(START_S)
    started = time.monotonic()
    os.kill(init_pid, signal.SIGTERM)
    try:
        tracer.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(init_pid, signal.SIGKILL)  # the runtime's SIGKILL at the end of the grace
        tracer.wait(timeout=60)
    stop_s = time.monotonic() - started
    reader.join(120)
    left = [pid for pid in names if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    traced = parse_strace(trace)
    end = traced.get(init_pid, Traced(init_pid)).end
    if end is None:
        code = "unknown"
    elif end.startswith("exited"):
        code = end.removeprefix("exited ")
    else:
        code = f"{128 + signal.Signals[end.removeprefix('killed by ')]} ({end})"
    processes = {pid: (names.get(pid, "?"), t) for pid, t in traced.items()
                 if pid in names and (pid != init_pid or init == "no init")}
    summary = None
    reported: dict[int, dict[str, Any]] = {}
    if init == "run":
        run_log = read_run_log(log.read_text(errors="replace"))
        summary, reported = run_log.summary, run_log.processes
    return Row(init, init_pid, main_pid, code, processes, left, stream.how, stop_s, summary,
               traced.get(init_pid, Traced(init_pid)).sent if init != "no init" else [],
               reported)


def run_flags(engine: str, scratch: Path, engine_port: int, grace_s: int) -> list[str]:
    """``run``'s flags: the engine's profile, its in-flight gauges on its own port."""
    return ["--port", "0", "--port-file", str(scratch / "coordinator.json"),
            "--grace-period", str(grace_s), "--safety-margin", "15", "--engine", engine,
            "--engine-metrics-url", f"http://127.0.0.1:{engine_port}/metrics"]


def unavailable(engine: str) -> str | None:
    """Why ``engine`` cannot be compared here, or None."""
    missing = [t for t in ("strace", "tini") if shutil.which(t) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: apt-get install {' '.join(missing)})"
    if not (ENGINES / engine / ".installed").exists():
        return f"{engine} is not installed in {ENGINES} (scripts/engines.sh {engine})"
    if engine == "sglang" and not list((ENGINES / "sglang").glob(
            "lib/python*/site-packages/sglang_cpu_platform")):
        return ("SGLang's CPU platform (sglang_cpu_platform) is not installed in its "
                "virtualenv: SGLang cannot run on this CPU without it")
    return None


def arguments(doc: str, inits: Sequence[str], argv: list[str] | None) -> argparse.Namespace:
    """The command line of an engine-under-each-init comparison."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("engine", choices=sorted(COMMANDS))
    parser.add_argument("--inits", nargs="*", default=list(inits))
    parser.add_argument("--grace", type=int, default=GRACE_S)
    parser.add_argument("--scratch", type=Path, default=None,
                        help="keep the logs and traces here (default: a temporary directory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = arguments(__doc__, list(INITS), argv)
    reason = unavailable(args.engine)
    if reason:
        print(reason)
        return 1

    def spawn(command: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL,
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)

    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.scratch or Path(temporary)
        model = write_tiny_model(Path(scratch) / "model")
        for init in args.inits:
            port = free_port()
            where = Path(scratch) / init.replace(" ", "-")
            row = run_one(init, COMMANDS[args.engine](model, port), f"http://127.0.0.1:{port}",
                          where, spawn, run_flags(args.engine, where, port, args.grace),
                          args.grace)
            print(row.markdown(), flush=True)
            rows.append(row)
    print("\n| init | exit code | the init sent | every process: signals received → its end "
          "(strace) | left running | the stream | stop took |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(row.markdown() for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
