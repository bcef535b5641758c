"""Processes that escape their tree are still drained, and the preStop hook is not.

Real coordinators, real trees (``tests/support/escaping_tree.py``) in a cgroup v2 or a mount
namespace of their own where a scenario needs a unit; every check is made against /proc and
the processes' own records (a file each writes when its SIGTERM handling runs), besides the
drain's summary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.rendering import DRAIN_HOOK
from tests.service.servers import FAST, Running, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.units import adopt_daemons, engine_unit, running

WHERE = {"cgroup": "cgroup", "mntns": "mount namespace"}


def processes(document: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(p["pid"]): p for p in document["processes"]}


def drain(running_: Running) -> dict[str, Any]:
    with running_.client() as client:
        response = client.get("/drain")
        assert response.status_code == 200, response.text
        summary: dict[str, Any] = response.json()
    assert summary["phase"] == "done"
    return summary


@pytest.mark.parametrize(("kind", "how"), [("cgroup", "registered"), ("mntns", "registered"),
                                           ("cgroup", "adopted"), ("mntns", "adopted")])
def test_a_daemon_of_a_root_in_its_own_unit_is_drained(
    janitor: ProcessJanitor, tmp_path: Path, kind: str, how: str
) -> None:
    """1. a root in a cgroup or mount namespace of its own; its child daemonizes (double fork,
    setsid) before the drain; 2. the root is registered, or adopted by pattern; 3. /status
    lists the daemon under the root; 4. GET /drain: the daemon, the child and the root are
    each reported once, ended by SIGTERM; the daemon ran its handler and is gone per /proc."""
    tag = f"escape-{uuid.uuid4().hex[:8]}"
    with engine_unit(kind, janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path / "tree", "--children", "1", "--daemon",
                               "now", "--tag", tag)
        (daemon,) = adopt_daemons(janitor, tmp_path / "tree")
        adopt = ["--adopt-pattern", f"--tag {tag}"] if how == "adopted" else []
        coordinator = start_coordinator(janitor, tmp_path, *FAST, *adopt)
        if how == "registered":
            register(coordinator, tree["pid"])
        everything = sorted([tree["pid"], *tree["children"], daemon["pid"]])
        listed = wait_for(lambda: sorted(processes(coordinator.status())) == everything
                          and coordinator.status(), what="the daemon listed")
        detail = f"left its tree (daemonized); found in the engine's {WHERE[kind]}"
        assert detail in processes(listed)[daemon["pid"]]["detail"]
        summary = drain(coordinator)
        ended = processes(summary)
        assert sorted(ended) == everything, summary["processes"]
        found = ended[daemon["pid"]]
        assert (found["fate"], found["signal"], found["root_pid"]) == ("exited", "SIGTERM",
                                                                       tree["pid"])
        assert detail in found["detail"]
        assert ended[tree["pid"]]["exit_code"] == 0
        assert summary["outcome"] == "graceful", summary
        assert (tmp_path / "tree" / f"daemon-{daemon['pid']}.json").exists()
        assert not running(daemon["pid"], daemon["start_ticks"])
        assert not any(running(pid) for pid in everything)


@pytest.mark.parametrize("kind", ["none", "cgroup"])
def test_children_a_worker_starts_just_before_it_crashes_are_drained(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a registered worker (its own session); the scan lists it, and no periodic scan
    comes after (an hour apart); 2. it starts two children and crashes: they are reparented
    away (with ``cgroup``, they also left its session and group by setsid, so only its cgroup
    tells them); 3. the worker's exit alone makes /status list them; 4. GET /drain ends both
    with ``SIGTERM`` (their own records), reports each once, and none runs any more per /proc;
    5. the crashed worker is in the summary too, ``gone`` with the exit code it crashed with
    (3), so the outcome is not graceful."""
    with engine_unit(kind, janitor) as unit:
        setsid = ["--late-setsid"] if kind == "cgroup" else []
        tree = unit.start_tree(janitor, tmp_path / "tree", "--children", "0", "--late", "2",
                               *setsid)
        coordinator = start_coordinator(janitor, tmp_path, *FAST, "--scan-interval", "3600")
        register(coordinator, tree["pid"])
        wait_for(lambda: list(processes(coordinator.status())) == [tree["pid"]],
                 what="the worker listed")
        os.kill(tree["pid"], signal.SIGUSR1)
        late_file = tmp_path / "tree" / "late.json"
        late = wait_for(lambda: late_file.exists() and json.loads(late_file.read_text())["pids"],
                        what="the late children")
        for pid in late:
            janitor.adopt(pid)
        assert len(late) == 2
        status = wait_for(lambda: sorted(processes(s := coordinator.status())) == sorted(late)
                          and s, what="the late children listed after the crash")
        assert [w["state"] for w in status["workers"]] == ["exited"]
        how = "found in the engine's cgroup" if kind == "cgroup" else "in the session its root"
        assert all(how in p["detail"] for p in status["processes"]), status["processes"]
        summary = drain(coordinator)
        ended = processes(summary)
        assert sorted(ended) == sorted([tree["pid"], *late]), summary["processes"]
        crashed = ended.pop(tree["pid"])
        assert (crashed["fate"], crashed["exit_code"]) == ("gone", 3), crashed
        assert summary["outcome"] == "failed"
        assert {(p["fate"], p["signal"]) for p in ended.values()} == {("exited", "SIGTERM")}
        for pid in late:
            assert (tmp_path / "tree" / f"late-{pid}.json").exists()
            assert not running(pid)


def assert_hook_spared(shell: subprocess.Popen[bytes], tmp: Path, coordinator: Running,
                       everything: list[int]) -> None:
    """The hook's shell and the hook exited 0 on their own, the hook printed a graceful
    summary, and the summary names exactly ``everything`` (the engine's processes), each
    exited and gone per /proc."""
    out = tmp / "hook.out"
    assert shell.wait(timeout=60) == 0
    assert (tmp / "hook.exit").read_text().strip() == "0", out.read_text()
    assert out.read_text().startswith("drain phase=done outcome=graceful"), out.read_text()
    summary = coordinator.status()
    ended = processes(summary)
    assert sorted(ended) == everything, summary["processes"]
    assert {p["fate"] for p in ended.values()} == {"exited"}
    assert not any(running(pid) for pid in everything)


@pytest.mark.parametrize("kind", ["cgroup", "mntns"])
def test_the_prestop_hook_in_the_engines_unit_is_not_killed(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a registered root in its own unit, with a daemon; 2. the preStop hook runs in the
    same unit, the way the kubelet's exec does (under a shell that does not exec it), and
    sends GET /drain; 3. the drain ends the daemon, the child and the root; 4. the hook and
    its shell are neither reported nor signalled: the hook prints the summary and exits 0."""
    with engine_unit(kind, janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path / "tree", "--children", "1", "--daemon", "now")
        (daemon,) = adopt_daemons(janitor, tmp_path / "tree")
        coordinator = start_coordinator(janitor, tmp_path, *FAST)
        register(coordinator, tree["pid"])
        everything = sorted([tree["pid"], *tree["children"], daemon["pid"]])
        wait_for(lambda: sorted(processes(coordinator.status())) == everything,
                 what="the tree listed")
        out = tmp_path / "hook.out"
        script = (f"{sys.executable} {DRAIN_HOOK} --url {coordinator.url}; "
                  f"echo $? > {tmp_path}/hook.exit")
        with out.open("wb") as handle:
            shell = janitor.spawn([*unit.joining(tree["pid"]), "sh", "-c", script],
                                  stdout=handle, stderr=subprocess.STDOUT)
        assert_hook_spared(shell, tmp_path, coordinator, everything)


HELD_HOOK = """
import runpy, sys
hook, url, gate = sys.argv[1:]
with open(gate) as fifo:  # blocks until the test opens the gate: listed, not yet connected
    fifo.read()
sys.argv = [hook, "--url", url]
runpy.run_path(hook, run_name="__main__")
"""


@pytest.mark.parametrize("kind", ["cgroup", "mntns"])
def test_a_prestop_hook_a_scan_listed_before_it_connected_is_not_in_the_summary(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a registered root in its own unit; 2. the preStop hook starts in the unit under a
    shell and waits before it connects, until a scan has listed it and its shell under the
    root (as a hook that starts between two scans is); 3. it sends GET /drain: the drain ends
    the root and its child and leaves the hook and its shell alone; 4. the summary names the
    tree only (no hook ``survived`` or ``gone``), graceful, and the hook exits 0."""
    with engine_unit(kind, janitor) as unit:
        tree = unit.start_tree(janitor, tmp_path / "tree", "--children", "1")
        coordinator = start_coordinator(janitor, tmp_path, *FAST)
        register(coordinator, tree["pid"])
        everything = sorted([tree["pid"], *tree["children"]])
        wait_for(lambda: sorted(processes(coordinator.status())) == everything,
                 what="the tree listed")
        gate = tmp_path / "gate"
        os.mkfifo(gate)
        out = tmp_path / "hook.out"
        script = (f"{sys.executable} -c '{HELD_HOOK}' {DRAIN_HOOK} {coordinator.url} {gate}; "
                  f"echo $? > {tmp_path}/hook.exit")
        with out.open("wb") as handle:
            shell = janitor.spawn([*unit.joining(tree["pid"]), "sh", "-c", script],
                                  stdout=handle, stderr=subprocess.STDOUT)
        hook = wait_for(lambda: [int(c) for c in Path(f"/proc/{shell.pid}/task/{shell.pid}/"
                                                      "children").read_text().split()],
                        what="the hook started")
        listed = wait_for(lambda: (ps := processes(coordinator.status())).keys() >= {
            shell.pid, *hook} and ps, what="the hook and its shell listed by a scan")
        assert listed[shell.pid]["root_pid"] == tree["pid"]
        with gate.open("w") as fifo:
            fifo.write("go")
        assert_hook_spared(shell, tmp_path, coordinator, everything)


def test_a_child_that_died_with_its_crashed_worker_before_any_scan_is_in_the_summary(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a worker (its own session) under a subreaper that reaps nothing yet (a slow init);
    the scan lists the worker, and no periodic scan comes after (an hour apart);
    2. it starts a child that dies with it (PDEATHSIG), and is SIGKILLed: both are zombies
    now, the child never listed while it ran;
    3. the drain's summary names both, ``gone``, each with the exit code /proc holds for it
    (-9), and judges the drain not graceful; 4. the subreaper then reaps them and exits 0."""
    keeper = janitor.spawn([sys.executable, "-m", "tests.service.zombie_keeper",
                            str(tmp_path)], cwd=Path(__file__).resolve().parents[2],
                           service=True)
    worker = int(wait_for(lambda: (tmp_path / "worker.pid").exists()
                          and (tmp_path / "worker.pid").read_text(), what="the worker"))
    coordinator = start_coordinator(janitor, tmp_path, *FAST, "--scan-interval", "3600")
    register(coordinator, worker)
    wait_for(lambda: list(processes(coordinator.status())) == [worker], what="the worker listed")
    os.kill(worker, signal.SIGUSR1)
    child = int(wait_for(lambda: (tmp_path / "child.pid").exists()
                         and (tmp_path / "child.pid").read_text(), what="the child"))
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: zombie_status(child) == signal.SIGKILL, what="the child a zombie")
    assert zombie_status(worker) == signal.SIGKILL
    summary = drain(coordinator)
    ended = processes(summary)
    assert sorted(ended) == sorted([worker, child]), summary["processes"]
    assert {pid: (p["fate"], p["exit_code"]) for pid, p in ended.items()} == {
        worker: ("gone", -9), child: ("gone", -9)}
    assert summary["outcome"] != "graceful"
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(timeout=30) == 0
    assert not running(worker)
    assert not running(child)


def zombie_status(pid: int) -> int | None:
    """The signal that ended ``pid`` while it is a zombie (from ``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return None
    return int(fields[49]) & 0x7F if fields[0] == "Z" else None
