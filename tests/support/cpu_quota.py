"""Hold processes a test started to a share of one CPU, as a pod's CPU limit would.

``cpu_quota(pids, cpus)`` moves the processes into a cgroup of their own whose CFS quota is
``cpus`` (0.5: half of one core, however many cores the machine has) and moves them back to
the root cgroup on exit, then removes the cgroup. The quota slows only those processes;
their neighbours keep their share, which a process spinning on the same core does not give
(it starved everything else on a 2-core machine). Threads and children started later sit in
the cgroup too.

cgroup v1's ``cpu`` hierarchy (``/sys/fs/cgroup/cpu``, this machine's and CI's, where podman
sets its ``--cpus`` the same way) or cgroup v2's ``cpu.max``; the test is skipped, saying
why, where neither can be written (not root, no ``cpu`` controller).
"""

from __future__ import annotations

import contextlib
import errno
import uuid
from collections.abc import Iterable, Iterator
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


def _move(procs: Path, pid: int) -> None:
    try:
        procs.write_text(str(pid))
    except OSError as exc:
        if exc.errno != errno.ESRCH:  # gone already: nothing to hold or release
            raise


@contextlib.contextmanager
def cpu_quota(pids: Iterable[int], cpus: float) -> Iterator[Path]:
    """Hold ``pids`` (and what they start) to ``cpus`` of one CPU; yields the cgroup."""
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
    try:
        quota = int(cpus * PERIOD_US)
        if version == "v1":
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        for pid in pids:
            _move(group / "cgroup.procs", pid)
            moved.append(pid)
        yield group
    finally:
        # Back to the root: the cgroup can only be removed once empty.
        left = (group / "cgroup.procs").read_text().split() if group.exists() else []
        for pid in {*moved, *map(int, left)}:
            _move(root / "cgroup.procs", pid)
        with contextlib.suppress(OSError):
            group.rmdir()
