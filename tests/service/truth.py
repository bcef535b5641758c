"""Hold a drain summary against what really happened to a test tree (tests/kill/trees.py).

The ground truth comes from outside the coordinator, never from its own summary:

- each process's own record: a node writes one when its SIGTERM cleanup finished, just before
  it exits; a node without one never ran its cleanup (a SIGKILL ended it);
- the exit code its parent saw: each node's record lists the exit code of every child it
  reaped, and the root's code is the test's own ``Popen.wait()`` status;
- ``/proc``: nothing of the tree may still run (a zombie has ended, see ``alive``).

``assert_summary_is_true`` compares both ways: every process of the tree is listed once and
none besides, each fate and exit code is what happened, the fate counts add up, and the
outcome is the one that what happened calls for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.kill import pidfd
from tests.kill.helpers import Tree, alive

SIGKILLED = -9


@dataclass(frozen=True)
class Ending:
    """How one process of a test tree ended, as seen from outside the coordinator."""

    cleanup: bool
    """It ran its SIGTERM cleanup to the end (its own record says so)."""
    exit_code: int | None
    """What its parent saw (-N for a signal); None when nobody outside saw it (its parent was
    SIGKILLed before it could write what it reaped)."""

    @property
    def fate(self) -> str:
        """The fate a truthful summary gives it: it ends on SIGTERM only through its cleanup,
        so a process without a record needed SIGKILL."""
        return "exited" if self.cleanup else "killed"


def endings(tree: Tree, root_code: int) -> dict[int, Ending]:
    """How every process of ``tree`` ended; ``root_code`` is the root's ``Popen.wait()``."""
    markers = tree.markers()
    assert set(markers) <= set(tree.pids()), f"records of strangers: {sorted(markers)}"
    codes: dict[int, int] = {tree.pid: root_code}
    for marker in markers.values():
        for pid, code in marker.get("reaped", {}).items():
            codes[int(pid)] = int(code)
    out = {pid: Ending(pid in markers, codes.get(pid)) for pid in tree.pids()}
    for pid, ending in out.items():
        if not ending.cleanup and ending.exit_code is not None:
            assert ending.exit_code == SIGKILLED, f"{pid} ended without cleanup: {ending}"
    return out


def expected_outcome(truth: dict[int, Ending]) -> str:
    """``killed`` when anything needed SIGKILL, ``graceful`` when everything ran its cleanup
    and exited 0; other cases need the test to say what it expects."""
    if any(not e.cleanup for e in truth.values()):
        return "killed"
    if all(e.exit_code == 0 for e in truth.values() if e.exit_code is not None):
        return "graceful"
    raise AssertionError(f"no single expected outcome for {truth}; pass outcome=")


def assert_summary_is_true(
    summary: dict[str, Any],
    tree: Tree,
    *,
    root_code: int,
    outcome: str | None = None,
) -> dict[int, Ending]:
    """Fail unless ``summary`` (a ``GET /drain`` answer or a ``/status`` document after the
    drain) says what really happened to ``tree``; returns the truth for further checks.

    ``outcome`` is required when the truth alone does not decide it (a non-zero exit code).
    """
    listed: list[dict[str, Any]] = list(summary["processes"])
    pids = [int(p["pid"]) for p in listed]
    assert len(pids) == len(tree.pids()), (sorted(pids), sorted(tree.pids()))
    assert sorted(pids) == sorted(tree.pids())
    still_running = [pid for pid in tree.pids() if alive(pid)]
    assert not still_running, f"the summary says done, yet these run: {still_running}"
    truth = endings(tree, root_code)
    # With PIDFD_INFO_EXIT (Linux 6.15+) the kernel tells anyone the exit code of a process
    # its parent reaped; without it, a code the summary does not know may be null.
    # The root is the test's own child: a zombie (its code readable) until the test waits.
    kernel_tells = pidfd.support().exit_info
    for entry in listed:
        ending = truth[int(entry["pid"])]
        assert entry["fate"] == ending.fate, (entry, ending)
        known = kernel_tells or entry["pid"] == tree.pid or entry["exit_code"] is not None
        if ending.exit_code is not None and known:
            assert entry["exit_code"] == ending.exit_code, (entry, ending)
    assert entry_counts(listed) == Counter(e.fate for e in truth.values())
    counts = summary.get("counts")
    if counts is not None:
        assert {fate: n for fate, n in counts.items() if n} == dict(
            Counter(e.fate for e in truth.values())), counts
    want = expected_outcome(truth) if outcome is None else outcome
    assert summary["outcome"] == want, (summary["outcome"], truth)
    return truth


def entry_counts(listed: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(str(p["fate"]) for p in listed)
