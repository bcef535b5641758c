"""Command-line patterns cannot block the coordinator: RE2 matches in linear time, and what it
cannot express (backreferences, lookaround) is refused when given, with the reason."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from coordinator import exit_codes
from coordinator.kill.patterns import PatternError, compile_pattern, search
from tests.service.servers import FAST, ROOT, start_coordinator
from tests.support.processes import ProcessJanitor

EVIL = r"(a+)+$"
"""Python's re takes time doubling with each 'a' of a text of a's that does not end in one."""


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    """``(a+)+$`` against 100,000 a's and a b ends (with Python's re it would not, in any
    lifetime), and still finds what it should."""
    assert not search(EVIL, "a" * 100_000 + "b")
    assert search(EVIL, "b" + "a" * 100_000)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)", r"(?<!a)b", "(", "x" * 1001])
def test_what_re2_cannot_use_is_refused_with_the_reason(pattern: str) -> None:
    with pytest.raises(PatternError, match=r"RE2 accepts|longer than 1000"):
        compile_pattern(pattern)


def test_the_refusal_reaches_the_operator_and_the_api(janitor: ProcessJanitor,
                                                      tmp_path: Path) -> None:
    """1. ``serve --adopt-pattern '(a)\\1'`` exits 2 with the reason; 2. a registration whose
    tier has a lookahead is answered 422 with the reason, and nothing is registered."""
    proc = janitor.spawn_python(["-m", "coordinator", "serve", "--port", "0",
                                 "--adopt-pattern", r"(a)\1"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.USAGE, out
    assert "is not a pattern RE2 accepts" in out
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    running = start_coordinator(janitor, tmp_path)
    with running.client() as client:
        answer = client.post("/workers", json={
            "pid": sleeper.pid, "tiers": [{"name": "x", "pattern": "(?=python)"}]})
    assert answer.status_code == 422, answer.text
    assert "RE2" in answer.text
    assert running.status()["workers"] == []


def test_a_drain_adopting_by_a_backtracking_pattern_ends(janitor: ProcessJanitor,
                                                         tmp_path: Path) -> None:
    """1. a process whose command line is 5,000 a's and a b; 2. a coordinator adopting by
    ``(a+)+$``, which the kill re-discovers on the event loop; 3. the drain ends ``done``
    with nothing adopted (the pattern does not match), and the process is untouched."""
    bystander = janitor.spawn_python(["-c", "import time; time.sleep(600)", "a" * 5000 + "b"],
                                     service=True, exit_code=-signal.SIGTERM)
    running = start_coordinator(janitor, tmp_path, *FAST, "--adopt-pattern", EVIL)
    with running.client() as client:
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    assert summary["outcome"] == "nothing_to_drain"
    assert summary["processes"] == []
    assert bystander.poll() is None
