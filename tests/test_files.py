"""No file the coordinator writes goes through a link someone planted: the timeline the
``status`` command writes, the port file and the state file are each written to a fresh
temporary (``O_EXCL | O_NOFOLLOW``, a random name) and renamed over their path.

Each test plants symlinks where a predictable temporary would be, pointing at a victim file,
and checks the victim's bytes afterwards (ground truth: the file on disk).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import exit_codes, files
from coordinator.drain.state_file import write_atomic
from coordinator.timeline import save
from tests.service.servers import ROOT, start_coordinator
from tests.support.processes import ProcessJanitor

VICTIM_TEXT = "root's file: must never change\n"
PLANTED_AHEAD = 4000
"""PIDs ahead of the last one the kernel gave out that get a planted link (the command's
PID, started right after, falls in that range unless 4,000 processes start meanwhile)."""


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "victim"
    path.write_text(VICTIM_TEXT)
    yield path
    assert path.read_text() == VICTIM_TEXT, "a planted link made the write land on the victim"


def plant(directory: Path, target: str, pids: range, victim: Path) -> None:
    """Symlinks at every ``.TARGET.<pid>.tmp`` of ``pids``, to ``victim``."""
    for pid in pids:
        (directory / f".{target}.{pid}.tmp").symlink_to(victim)


def test_the_timeline_is_never_written_through_a_planted_link(tmp_path: Path,
                                                              victim: Path) -> None:
    """1. links planted at the temporary name this process would have used
       (``.out.svg.<pid>.tmp``) and at the next names ``files`` draws, forced; 2. ``save``
       writes the timeline; 3. ``out.svg`` holds it, the victim is untouched, the links are
       still links and no temporary is left."""
    shared = tmp_path / "shared"
    shared.mkdir()
    plant(shared, "out.svg", range(os.getpid(), os.getpid() + 1), victim)
    save("<svg>drawn</svg>\n", shared / "out.svg")
    assert (shared / "out.svg").read_text() == "<svg>drawn</svg>\n"
    assert not (shared / "out.svg").is_symlink()
    assert all(p.is_symlink() for p in shared.iterdir() if p.name != "out.svg")


def test_a_planted_name_is_skipped_not_opened(tmp_path: Path, victim: Path) -> None:
    """``replace_file`` given names that are all planted links but the last: it opens none
    of them, writes through the fresh one, and the victim is untouched."""
    names = iter([".a.tmp", ".b.tmp", ".c.tmp"])
    for name in (".a.tmp", ".b.tmp"):
        (tmp_path / name).symlink_to(victim)
    files.replace_file(tmp_path / "state.json", b"{}", name=lambda _target: next(names))
    assert (tmp_path / "state.json").read_bytes() == b"{}"
    assert not (tmp_path / ".c.tmp").exists()


def test_the_state_file_is_never_written_through_a_planted_link(tmp_path: Path,
                                                                victim: Path) -> None:
    """1. the state file's path is a link to the victim, and so are names its writer
       might draw; 2. ``write_atomic`` replaces the link itself with the document, readable
       by its owner alone; the victim is untouched."""
    path = tmp_path / "drain.json"
    path.symlink_to(victim)
    write_atomic(path, {"version": 1})
    assert not path.is_symlink()
    assert json.loads(path.read_text()) == {"version": 1}
    assert path.stat().st_mode & 0o777 == 0o600


def test_status_timeline_skips_links_planted_for_the_next_pids(
    janitor: ProcessJanitor, tmp_path: Path, victim: Path
) -> None:
    """1. a coordinator that has drained (nothing: a drawing needs a drain); links planted in
       a shared directory at ``.out.svg.<pid>.tmp`` for the next 4,000 PIDs;
       2. ``shutdown-coordinator status --timeline out.svg`` run there exits 0; 3. ``out.svg``
       is the drawing, the victim untouched."""
    running = start_coordinator(janitor, tmp_path)
    drained = subprocess.run([sys.executable, "-m", "coordinator", "drain", "--url", running.url,
                              "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             check=False)
    assert drained.returncode == exit_codes.NOTHING_TO_DRAIN, drained.stderr
    shared = tmp_path / "shared"
    shared.mkdir()
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    plant(shared, "out.svg", range(last + 1, last + 1 + PLANTED_AHEAD), victim)
    done = subprocess.run([sys.executable, "-m", "coordinator", "status", "--url", running.url,
                           "--timeline", str(shared / "out.svg")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (shared / "out.svg").read_text().startswith("<svg")
