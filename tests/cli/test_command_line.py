"""What the command line accepts and says, flag by flag: abbreviations refused, a token file
that cannot be read named by its flag, every variable in ``--help``, ``kill`` with nothing
to end, and a timeline written only where one exists and as the file name says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from coordinator import exit_codes
from coordinator.cli import main
from devstack.demo import parse_args
from tests.service.servers import ROOT, start_coordinator
from tests.support.processes import ProcessJanitor

COMMAND = [sys.executable, "-m", "coordinator"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})


UNREACHABLE = "http://127.0.0.1:1"
"""No command line here may reach a coordinator, whatever it is parsed as."""


@pytest.mark.parametrize(("argv", "flag"), [
    (["serve", "--port", "-1", "--grace", "20"], "--grace"),
    (["serve", "--port", "-1", "--adopt-pat", "x"], "--adopt-pat"),
    (["status", "--url", UNREACHABLE, "--jso"], "--jso"),
    (["drain", "--url", UNREACHABLE, "--quie"], "--quie"),
    (["drain", "--url", UNREACHABLE, "--abor"], "--abor"),
    (["kill", "--forc", "1"], "--forc"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_an_abbreviated_flag_is_refused(argv: list[str], flag: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``serve --grace 20`` must not mean ``--grace-period 20``: a later flag starting the
    same way would change what a script's abbreviation means. (Taken in full, each of these
    would fail otherwise: a port of -1, no coordinator at the URL, PID 1 refused.)"""
    assert main(argv) == exit_codes.USAGE
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_the_demo_refuses_an_abbreviated_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--stream", "3"])
    assert exited.value.code == exit_codes.USAGE
    assert "unrecognized arguments: --stream" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_token_file_that_cannot_be_read_is_named_with_its_flag(given: str) -> None:
    """The error names where the path came from (the flag, or its variable), the path and
    why, in one line: exit 2 before any call (the address is unreachable anyway)."""
    missing = f"/nonexistent-{uuid.uuid4().hex}"
    flags = ["--token-file", missing] if given == "flag" else []
    env = {"SHUTDOWN_COORDINATOR_TOKEN_FILE": missing} if given == "variable" else {}
    result = run("status", "--url", "http://127.0.0.1:1", *flags, env=env)
    assert result.returncode == exit_codes.USAGE
    source = "--token-file" if given == "flag" else "SHUTDOWN_COORDINATOR_TOKEN_FILE"
    assert result.stderr == (f"error: {source} {missing}: cannot read the token: No such "
                             "file or directory\n")


def test_serve_help_names_every_variable_of_the_token() -> None:
    text = run("serve", "--help").stdout
    assert "SHUTDOWN_COORDINATOR_TOKEN_FILE" in text
    assert re.search(r"SHUTDOWN_COORDINATOR_TOKEN\b(?!_)", text), text


def test_kill_with_nothing_to_end_exits_nothing_to_drain() -> None:
    """``kill`` of a PID that is gone, and of a pattern nothing matches: nothing was ended,
    which ``drain`` calls 14, not 0; stderr says so."""
    gone = run("kill", str(_unused_pid()))
    assert gone.returncode == exit_codes.NOTHING_TO_DRAIN, gone.stderr
    assert "every target was already gone: nothing to end" in gone.stderr
    assert " gone" in gone.stdout  # the report still shows it
    nomatch = run("kill", "--pattern", f"nothing-matches-{uuid.uuid4().hex}")
    assert nomatch.returncode == exit_codes.NOTHING_TO_DRAIN
    assert "no process matches: nothing to end" in nomatch.stderr


def test_the_timeline_is_written_as_named_and_only_when_there_is_a_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``--timeline x.png``: refused (the drawing is SVG), before any call. 2. A
    coordinator that never drained: ``--timeline t.svg`` and ``--last-drain`` say there is
    nothing to draw and write nothing. 3. After a drain: it is drawn, as the current drain
    and as ``last_drain``."""
    png = tmp_path / "x.png"
    refused = run("status", "--url", "http://127.0.0.1:1", "--timeline", str(png))
    assert refused.returncode == exit_codes.USAGE
    assert "the timeline is drawn as SVG; name the file FILE.svg" in refused.stderr
    assert not png.exists()
    running = start_coordinator(janitor, tmp_path)
    svg = tmp_path / "t.svg"
    for which in ([], ["--last-drain"]):
        result = run("status", "--url", running.url, "--timeline", str(svg), *which)
        assert result.returncode == exit_codes.USAGE
        assert "nothing written" in result.stderr
        assert not svg.exists()
    assert run("drain", "--url", running.url, "--quiet").returncode == (
        exit_codes.NOTHING_TO_DRAIN)
    drawn = run("status", "--url", running.url, "--timeline", str(svg))
    assert drawn.returncode == exit_codes.OK, drawn.stderr
    assert svg.read_text().lstrip().startswith("<svg")
    last = run("status", "--url", running.url, "--timeline", str(tmp_path / "b.svg"),
               "--last-drain")
    assert last.returncode == exit_codes.OK, last.stderr  # the finished drain is last_drain
    assert (tmp_path / "b.svg").read_text().lstrip().startswith("<svg")


def _unused_pid() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))
