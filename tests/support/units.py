"""Give a test's engine a unit of its own, as a container would: a cgroup v2 or a mount ns.

``engine_unit(kind, janitor)`` yields an ``EngineUnit``; processes started with its
``prefix`` (and everything they start) sit in the unit. On exit every process still in the
unit (they were all started by the test) is handed to the janitor and ended, and the cgroup
directory, if any, is removed once empty. Skips the test when the kind is not available.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ProcessJanitor, wait_for

CGROUP_V2 = Path("/sys/fs/cgroup/unified")
KINDS = ("cgroup", "mntns")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class EngineUnit:
    kind: str
    prefix: list[str]
    """Prepend to an argv to start it inside the unit."""
    cgroup: Path | None = None
    mnt: set[str] = field(default_factory=set)
    """Mount namespaces of processes started in the unit (``note``)."""

    def start_tree(self, janitor: ProcessJanitor, record_dir: Path, *args: str,
                   ) -> dict[str, Any]:
        """Start ``tests.support.escaping_tree`` in the unit (its own session); its ready
        document once every process of it runs."""
        record_dir.mkdir(parents=True, exist_ok=True)
        janitor.spawn([*self.prefix, sys.executable, "-m", "tests.support.escaping_tree",
                       str(record_dir), *args], cwd=REPO)
        ready = record_dir / "ready.json"
        text = wait_for(lambda: ready.exists() and ready.read_text(), what="escaping tree up")
        document: dict[str, Any] = json.loads(text)
        self.note(int(document["pid"]))
        return document

    def joining(self, pid: int) -> list[str]:
        """Prepend to an argv to start it in the unit ``pid`` (started with ``prefix``) is in."""
        if self.kind == "mntns":
            return ["nsenter", "-t", str(pid), "-m"]
        return list(self.prefix)

    def note(self, pid: int) -> None:
        """Remember the mount namespace of a process started in the unit (mntns kind)."""
        if self.kind == "mntns":
            self.mnt.add(os.readlink(f"/proc/{pid}/ns/mnt"))

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` sits in this unit (per /proc)."""
        try:
            if self.cgroup is not None:
                lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                return f"0::/{self.cgroup.name}" in lines
            return os.readlink(f"/proc/{pid}/ns/mnt") in self.mnt
        except OSError:
            return False

    def members(self) -> list[int]:
        """PIDs of the processes in the unit now."""
        if self.cgroup is not None:
            text = (self.cgroup / "cgroup.procs").read_text()
            return [int(line) for line in text.split()]
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
        return [pid for pid in pids if pid != os.getpid() and self.holds(pid)]


def _make_cgroup() -> Path:
    if not (CGROUP_V2 / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v2 hierarchy at {CGROUP_V2}")
    path = CGROUP_V2 / f"shutdown-coordinator-test-{uuid.uuid4().hex[:10]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroup v2 at {CGROUP_V2} is not writable: {exc}")
    return path


def _check_unshare() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -m is not permitted here: {probe.stderr.strip()}")


@contextlib.contextmanager
def engine_unit(kind: str, janitor: ProcessJanitor) -> Iterator[EngineUnit]:
    """A cgroup (``cgroup``) or mount namespace (``mntns``) for the test's engine; ``none``
    leaves it where the test runs (with the coordinator: no unit of its own)."""
    if kind == "none":
        unit = EngineUnit(kind, [])
    elif kind == "cgroup":
        path = _make_cgroup()
        unit = EngineUnit(kind, ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"',
                                 str(path)], cgroup=path)
    else:
        _check_unshare()
        unit = EngineUnit(kind, ["unshare", "-m", "--propagation", "private"])
    try:
        yield unit
    finally:
        for pid in unit.members() if kind != "none" else ():
            janitor.adopt(pid)
        janitor.close()
        if unit.cgroup is not None:
            events = unit.cgroup / "cgroup.events"
            wait_for(lambda: "populated 0" in events.read_text(), what="the test cgroup empty")
            unit.cgroup.rmdir()


def daemons(record_dir: Path) -> list[dict[str, Any]]:
    """What each daemon of an escaping tree recorded when it came up."""
    return [json.loads(p.read_text()) for p in sorted(record_dir.glob("daemon-*.pid"))]


def running(pid: int, start_ticks: int | None = None) -> bool:
    """Per /proc: ``pid`` runs (a zombie has ended), as the process that started then."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0] not in ("Z", "X") and start_ticks in (None, int(fields[19]))


def adopt_daemons(janitor: ProcessJanitor, record_dir: Path) -> list[dict[str, Any]]:
    """Hand every still-running daemon of an escaping tree to the janitor; their records."""
    found = daemons(record_dir)
    for d in found:
        if running(d["pid"], d["start_ticks"]):
            janitor.adopt(d["pid"])
    return found
