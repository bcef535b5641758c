"""The ground-truth check of tests/service/truth.py rejects every kind of lying summary.

The drain tests rely on ``assert_summary_is_true``; here a true summary of a real tree that
really ended passes, and each lie told about it (a process left out, added or listed twice, a
fate, an exit code, a count, the outcome, a process that still runs) fails the check.
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kill.helpers import Tree, alive, start_tree
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for

Lie = Callable[[dict[str, Any], Tree], None]


def _entry(summary: dict[str, Any], pid: int) -> dict[str, Any]:
    entry: dict[str, Any] = next(p for p in summary["processes"] if p["pid"] == pid)
    return entry


def _leave_out(summary: dict[str, Any], tree: Tree) -> None:
    summary["processes"] = [p for p in summary["processes"] if p["pid"] != tree.pids("child")[0]]


def _add_stranger(summary: dict[str, Any], tree: Tree) -> None:
    summary["processes"].append({**summary["processes"][0], "pid": 4_194_001})


def _list_twice(summary: dict[str, Any], tree: Tree) -> None:
    summary["processes"].append(dict(summary["processes"][-1]))


def _killed_called_exited(summary: dict[str, Any], tree: Tree) -> None:
    entry = _entry(summary, tree.pids("stubborn")[0])
    entry.update(fate="exited", exit_code=0)
    summary["counts"].update(exited=summary["counts"]["exited"] + 1,
                             killed=summary["counts"]["killed"] - 1)


def _exited_called_killed(summary: dict[str, Any], tree: Tree) -> None:
    _entry(summary, tree.pids("child")[0])["fate"] = "killed"


def _wrong_root_code(summary: dict[str, Any], tree: Tree) -> None:
    _entry(summary, tree.pid)["exit_code"] = 1


def _unknown_root_code(summary: dict[str, Any], tree: Tree) -> None:
    # The root stays a zombie until the test's own wait: its code is always there to read.
    _entry(summary, tree.pid)["exit_code"] = None


def _wrong_child_code(summary: dict[str, Any], tree: Tree) -> None:
    _entry(summary, tree.pids("child")[0])["exit_code"] = 0


def _wrong_counts(summary: dict[str, Any], tree: Tree) -> None:
    summary["counts"]["exited"] += 1


def _graceful(summary: dict[str, Any], tree: Tree) -> None:
    summary["outcome"] = "graceful"


LIES: dict[str, Lie] = {
    "left-out": _leave_out, "stranger": _add_stranger, "twice": _list_twice,
    "killed-as-exited": _killed_called_exited, "exited-as-killed": _exited_called_killed,
    "root-code": _wrong_root_code, "root-code-unknown": _unknown_root_code,
    "child-code": _wrong_child_code, "counts": _wrong_counts,
    "outcome": _graceful,
}

SPEC = {"role": "root", "children": [{"role": "child", "exit_code": 3},
                                     {"role": "stubborn", "ignore_term": True}]}


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Tree, int]:
    """A tree ended as a drain would end it, and the true summary of it: the child ran its
    cleanup (exit 3), the stubborn child and then the root were SIGKILLed."""
    janitor = ProcessJanitor()
    try:
        tree = start_tree(janitor, SPEC, tmp_path_factory.mktemp("truth") / "tree")
        (child,) = tree.pids("child")
        (stubborn,) = tree.pids("stubborn")
        os.kill(child, signal.SIGTERM)
        wait_for(lambda: child in tree.markers() and not alive(child), what="the child's end")
        os.kill(stubborn, signal.SIGKILL)
        wait_for(lambda: not alive(stubborn), what="the stubborn child's end")
        # The root records what it reaped when it ends on SIGTERM.
        os.kill(tree.pid, signal.SIGTERM)
        root_code = tree.root.wait(timeout=30)
    finally:
        janitor.close()
    processes = [
        {"pid": tree.pid, "fate": "exited", "exit_code": 0},
        {"pid": child, "fate": "exited", "exit_code": 3},
        {"pid": stubborn, "fate": "killed", "exit_code": -9},
    ]
    summary = {"processes": processes, "outcome": "killed",
               "counts": {"running": 0, "exited": 2, "killed": 1, "gone": 0, "survived": 0}}
    return summary, tree, root_code


def test_the_true_summary_passes(ended: tuple[dict[str, Any], Tree, int]) -> None:
    """1. a tree whose child ran its cleanup and exited 3, whose stubborn child was
    SIGKILLed, whose root ran its cleanup; 2. the summary that says so passes the check."""
    summary, tree, root_code = ended
    assert root_code == 0
    truth = assert_summary_is_true(copy.deepcopy(summary), tree, root_code=root_code)
    assert {pid: (e.fate, e.exit_code) for pid, e in truth.items()} == {
        tree.pid: ("exited", 0), tree.pids("child")[0]: ("exited", 3),
        tree.pids("stubborn")[0]: ("killed", -9)}


@pytest.mark.parametrize("lie", LIES.values(), ids=LIES.keys())
def test_each_lie_fails_the_check(ended: tuple[dict[str, Any], Tree, int], lie: Lie) -> None:
    """1. the true summary, changed by one lie; 2. the check fails."""
    summary, tree, root_code = ended
    lying = copy.deepcopy(summary)
    lie(lying, tree)
    with pytest.raises(AssertionError):
        assert_summary_is_true(lying, tree, root_code=root_code)


def test_a_process_that_still_runs_fails_the_check(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a tree that was never signalled; 2. a summary that says every process exited
    fails the check (/proc shows them running)."""
    tree = start_tree(janitor, {"children": [{}]}, tmp_path / "tree")
    summary = {"outcome": "graceful", "processes": [
        {"pid": pid, "fate": "exited", "exit_code": 0} for pid in tree.pids()]}
    with pytest.raises(AssertionError, match="run"):
        assert_summary_is_true(summary, tree, root_code=0)
    tree.end()
