"""Signal chaining with real signals to a real child process (no coordinator)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import ProcessJanitor

CHILD = Path(__file__).with_name("signal_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _start(janitor: ProcessJanitor, mode: str) -> subprocess.Popen[bytes]:
    proc = janitor.spawn(
        [sys.executable, str(CHILD), mode], cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
    return proc


def _rest(proc: subprocess.Popen[bytes]) -> list[str]:
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines: list[str] = out.decode().splitlines()
    return lines


def test_sigterm_drains_before_the_engine_handlers(janitor: ProcessJanitor) -> None:
    """1. Start an asyncio engine: its own signal.signal SIGTERM handler, then
       install_graceful_shutdown, then a loop.add_signal_handler SIGTERM handler; one request
       waiting in its generation.
    2. Send SIGTERM to the process.
    3. The request is handed back first; then the previous handler, then the captured loop
       handler, each exactly once; the engine's cleanup runs last; exit code 0."""
    proc = _start(janitor, "asyncio")
    proc.send_signal(signal.SIGTERM)
    lines = _rest(proc)
    assert lines == [
        "handed-back True 1", "previous-handler SIGTERM", "loop-handler SIGTERM",
        "engine-cleanup",
    ], lines


def test_previous_handler_runs_when_the_loop_handler_ends_the_engine_first(
    janitor: ProcessJanitor,
) -> None:
    """1. Start the same asyncio engine, except that any thread other than the loop's that
       hands the engine's loop handler to the loop is held there until the engine closed its
       client (the loop runs the handler, the engine exits and ignores the released SIGTERM
       before that thread goes on: an order the scheduler may pick).
    2. Send SIGTERM to the process.
    3. The previous handler still runs, exactly once and before the loop handler (which is
       handed over only after it returned); the engine's cleanup runs last; exit code 0."""
    proc = _start(janitor, "asyncio-held")
    proc.send_signal(signal.SIGTERM)
    lines = _rest(proc)
    assert lines.count("previous-handler SIGTERM") == 1, lines
    assert lines.count("loop-handler SIGTERM") == 1, lines
    assert lines.index("previous-handler SIGTERM") < lines.index("loop-handler SIGTERM"), lines
    assert lines[0] == "handed-back True 1", lines
    assert lines[-1] == "engine-cleanup", lines


def test_sigint_default_handler_runs_after_our_part(janitor: ProcessJanitor) -> None:
    """1. Start an asyncio engine under asyncio.run (its SIGINT handler cancels the main task).
    2. Send SIGINT.
    3. The request is handed back before KeyboardInterrupt unwinds the engine; exit code 0."""
    proc = _start(janitor, "asyncio")
    proc.send_signal(signal.SIGINT)
    lines = _rest(proc)
    assert lines == ["handed-back True 1", "engine-cleanup", "keyboard-interrupt"], lines


def test_sigint_in_an_engine_that_is_not_asyncio(janitor: ProcessJanitor) -> None:
    """1. Start a plain-threads engine with Python's default SIGINT handler.
    2. Send SIGINT.
    3. Its request sees the drain and is handed back; then KeyboardInterrupt arrives once."""
    proc = _start(janitor, "sync")
    proc.send_signal(signal.SIGINT)
    lines = _rest(proc)
    assert lines == ["handed-back True 0", "keyboard-interrupt", "engine-cleanup"], lines
