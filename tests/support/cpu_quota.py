"""Hold processes a test started to a share of one CPU, as a pod's CPU limit would.

``cpu_quota(pids, cpus)`` moves the processes into a cgroup of their own whose CFS quota is
``cpus`` (0.5: half of one core, however many cores the machine has) and yields a
``Quota``; ``lift()`` removes the limit where the processes are (no task is moved while the
test runs: moving a throttled process waits on it). On exit the limit is lifted, what is
left is moved back to the root cgroup and the cgroup removed. The quota slows only those
processes; their neighbours keep their share, which a process spinning on the same core
does not give (it starved everything else on a 2-core machine). Threads and children
started later sit in the cgroup too.

cgroup v1's ``cpu`` hierarchy (``/sys/fs/cgroup/cpu``, this machine's and CI's, where podman
sets its ``--cpus`` the same way) or cgroup v2's ``cpu.max``; the test is skipped, saying
why, where neither can be written (not root, no ``cpu`` controller).
"""

from __future__ import annotations

import contextlib
import errno
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _hierarchy() -> tuple[Path, str] | None:
    """(root, version) of a writable cpu controller, or None."""
    if (V1 / "cpu.cfs_quota_us").exists():
        return V1, "v1"
    controllers = V2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return V2, "v2"
    return None


@dataclass
class Quota:
    """One cgroup holding processes to a CPU quota."""

    group: Path
    version: str

    def set(self, cpus: float | None) -> None:
        """Hold the cgroup to ``cpus`` of one CPU; None: no limit."""
        quota = -1 if cpus is None else int(cpus * PERIOD_US)
        if self.version == "v1":
            (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.group / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {PERIOD_US}")

    def lift(self) -> None:
        """No limit from now on (the processes stay where they are)."""
        self.set(None)


def _move(procs: Path, pid: int) -> None:
    try:
        procs.write_text(str(pid))
    except OSError as exc:
        if exc.errno != errno.ESRCH:  # gone already: nothing to hold or release
            raise


@contextlib.contextmanager
def cpu_quota(pids: Iterable[int], cpus: float) -> Iterator[Quota]:
    """Hold ``pids`` (and what they start) to ``cpus`` of one CPU."""
    found = _hierarchy()
    if found is None:
        pytest.skip("no writable cpu cgroup controller (cgroup v1 cpu or v2 cpu.max)")
    root, version = found
    group = root / f"test-quota-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cpu cgroup under {root}: {exc}")
    moved: list[int] = []
    quota = Quota(group, version)
    try:
        quota.set(cpus)
        for pid in pids:
            _move(group / "cgroup.procs", pid)
            moved.append(pid)
        yield quota
    finally:
        # Unthrottled first, then back to the root: the cgroup is removed once empty.
        with contextlib.suppress(OSError):
            quota.lift()
        left = (group / "cgroup.procs").read_text().split() if group.exists() else []
        for pid in {*moved, *map(int, left)}:
            _move(root / "cgroup.procs", pid)
        with contextlib.suppress(OSError):
            group.rmdir()
