"""The demo, run the way a newcomer runs it: the console script in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import ProcessJanitor

ROOT = Path(__file__).resolve().parents[1]
DEMO = Path(sys.executable).parent / "shutdown-coordinator-demo"
"""The console script ``pip install -e .`` puts next to the interpreter (pyproject.toml's
``[project.scripts]``), as the README's first command runs it."""


def test_demo_loses_nothing_and_ends_gracefully(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Run `shutdown-coordinator-demo` with a small load (its own session, so every process
       it starts is ours to clean up).
    2. It exits 0 and reports 0 lost, 0 missing, 0 duplicated, and a graceful drain.
    3. It left no process behind: its session is empty once it has exited.
    4. Nor anything in the runtime directory: each coordinator it started removed its
       doorbell pipe (``--doorbell auto``) as it stopped."""
    assert DEMO.exists(), f"no {DEMO}: install the project again (pip install -e .)"
    out = tmp_path / "demo.out"
    with out.open("wb") as handle:
        proc = janitor.spawn([str(DEMO), "--streams", "12", "--tokens", "24",
                              "--teardown-s", "0.2"],
                             cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
        code = proc.wait(timeout=170)
    text = out.read_text()
    assert code == 0, text
    assert "lost 0" in text, text
    assert "missing 0   duplicated 0" in text, text
    assert "result: PASS" in text, text
    assert "dp_controller" in text, text
    assert "scheduler" in text, text
    assert not list(janitor.leftovers()), "the demo left processes behind"
    janitor.assert_clean()
