"""The README's Quickstart, run as a newcomer types it.

Each command of the block runs as printed, one after the other, the way a person at a
terminal runs them: a command started in the background is given the moment it needs to be
up (the coordinator listening, the engine registered) before the next line is typed. It runs
in a network namespace of its own, so the block's fixed port (8787) is free whatever else
runs on this machine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ProcessJanitor

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
UNSHARE = shutil.which("unshare")

WAIT_FOR = {
    "shutdown-coordinator serve": (
        "import time, urllib.request\n"
        "for _ in range(600):\n"
        "    try:\n"
        "        urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2); break\n"
        "    except OSError: time.sleep(0.1)\n"),
    "streaming_engine.py": (
        "import json, time, urllib.request\n"
        "for _ in range(600):\n"
        "    s = json.load(urllib.request.urlopen('http://127.0.0.1:8787/status', timeout=2))\n"
        "    if s['workers']: break\n"
        "    time.sleep(0.1)\n"),
}
"""What a person waits for after a command they put in the background (its line)."""


def quickstart() -> list[str]:
    """The Quickstart's commands: its bash block without comments and ``pip install``
    (the project is installed in the test's environment)."""
    text = README.read_text()
    section = text[text.index("\n## Quickstart"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")
            and not line.startswith("pip install")]


def test_the_quickstart_starts_one_coordinator_a_port() -> None:
    """Two ``serve`` on one port: the second fails with "Address already in use"."""
    serves = [line for line in quickstart() if "shutdown-coordinator serve" in line]
    ports = [re.search(r"--port[ =](\d+)", line) for line in serves]
    taken = [m.group(1) if m else "8787" for m in ports]
    assert len(taken) == len(set(taken)), serves


@pytest.mark.skipif(UNSHARE is None, reason="unshare (util-linux) is not installed")
def test_the_quickstart_runs_as_typed(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. In a network namespace of its own, run the Quickstart's commands as printed, each
       once the one before it is up. 2. ``status`` lists the engine; ``drain`` exits 0 with
       the outcome ``graceful``: the engine, SIGTERMed by the drain, exited 0 (its own
       record in the summary). 3. The coordinator, left in the background as the block
       leaves it, stops on SIGTERM with 0; nothing is left running."""
    lines = []
    for line in quickstart():
        lines.append(line)
        for started, wait in WAIT_FOR.items():
            if started in line and line.split("#")[0].rstrip().endswith("&"):
                lines.append(f"{sys.executable} -c {_quote(wait)}")
    script = "\n".join(["set -euo pipefail", "ip link set lo up", *lines,
                        "kill %1", "wait %1"]) + "\n"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
    out = tmp_path / "quickstart.out"
    with out.open("wb") as handle:
        proc = janitor.spawn([str(UNSHARE), "--net", "--map-root-user", "bash", "-c", script],
                             cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
        code = proc.wait(timeout=170)
    text = out.read_text()
    assert code == 0, text
    assert "Address already in use" not in text, text
    assert re.search(r"^w-\w+\s+\d+\s+worker\s+serving", text, re.M), text
    assert "outcome     graceful" in text, text
    assert re.search(r"^\d+\s+python\S*\s+worker\s+roots\s+exited\s+0\s+SIGTERM", text,
                     re.M), text


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
