"""The init's reaper and the kill engine read the same exits: every exit code stays the truth.

The probe (``tests.init.reaper_probe``) runs in a process of its own, as ``run`` does: a
subreaper reaping every child on SIGCHLD while the kill engine ends a tree of its children.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ProcessJanitor

PROBE_S = 120.0


def _probe(janitor: ProcessJanitor, tmp_path: Path, modes: str) -> dict[str, Any]:
    records = tmp_path / "records"
    records.mkdir()
    proc = janitor.spawn_python(["-m", "tests.init.reaper_probe", modes, str(records)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=PROBE_S)
    assert proc.returncode == 0, err.decode()
    found: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    found["records"] = {r.name: json.loads(r.read_text()) for r in records.glob("*-*.json")}
    return found


@pytest.mark.parametrize("modes", ["natural", "reap-first,no-pidfd-info"],
                         ids=["either-first", "reaped-before-read-without-pidfd-info"])
def test_codes_of_reaped_processes_are_the_truth(janitor: ProcessJanitor, tmp_path: Path,
                                                  modes: str) -> None:
    """1. In the probe, start root (exit 3) with children steady, selfkill and mid, mid's
       child leaf (exit 5); SIGKILL mid, so leaf is reparented to the probe.
    2. Kill root's tree while SIGCHLD reaps every child of the probe; in the second case
       every exit is reaped before the kill reads its code, with ``PIDFD_GET_INFO`` (which
       keeps a reaped process's code on Linux 6.15+) answering nothing.
    3. Root and leaf, the probe's children, are reported with the statuses the kernel gave
       the reaper (3 and 5), each after the cleanup its own record shows; the kill found the
       reparented leaf; selfkill's code, where known, is the one its parent saw."""
    found = _probe(janitor, tmp_path, modes)
    report, collected = found["report"], found["reaped"]
    root, leaf = str(found["root"]), str(found["leaf"])
    assert collected[root] == 3
    assert collected[leaf] == 5
    assert report[root]["exit_code"] == 3, report
    assert report[leaf]["exit_code"] == 5, report
    assert {report[p]["fate"] for p in (root, leaf)} == {"exited"}
    records = found["records"]
    assert records[f"root-{root}.json"]["cleanup_finished"]
    assert records[f"leaf-{leaf}.json"]["cleanup_finished"]
    selfkill = next(str(p["pid"]) for p in found["tree"] if p["role"] == "selfkill")
    seen_by_root = records[f"root-{root}.json"]["reaped"]
    assert report[selfkill]["exit_code"] in (None, seen_by_root[selfkill])


def test_without_the_reapers_records_the_codes_are_lost(janitor: ProcessJanitor,
                                                         tmp_path: Path) -> None:
    """The control: the same run, the reaper's records not read. The codes of the probe's
    own children are unknown: what the test above holds comes from those records."""
    found = _probe(janitor, tmp_path, "reap-first,no-pidfd-info,no-book")
    report = found["report"]
    assert found["reaped"][str(found["root"])] == 3
    assert report[str(found["root"])]["exit_code"] is None, report
    assert report[str(found["leaf"])]["exit_code"] is None, report
