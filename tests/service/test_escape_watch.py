"""On a plain host an engine has no cgroup or mount namespace of its own, so a daemon that
leaves its tree by ``setsid`` cannot be found: ``/status``, the drain's summary and the
``status`` command say so, instead of reading as complete. An engine with a unit of its own
(here a mount namespace) is watched, and nothing is said."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.service.servers import FAST, ROOT, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.units import engine_unit


def test_a_plain_hosts_summary_says_escapes_were_not_watched_for(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a sleep registered where the coordinator runs (one cgroup, one mount namespace);
    2. ``/status`` ``escapes`` names it as not watched, with how to give it a unit;
    3. ``shutdown-coordinator status`` prints the same; 4. the drain's summary names it in
       ``drain.escapes``, and the sleep was ended (per /proc) as before."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    sleeper = janitor.spawn(["sleep", "600"], cwd="/", service=True,
                            exit_code=-signal.SIGTERM)
    register(running, sleeper.pid)
    escapes = wait_for(lambda: running.status()["escapes"], what="the scan's verdict")
    assert escapes["watched"] is False
    assert escapes["unwatched_roots"] == [sleeper.pid]
    assert "KillMode=control-group" in escapes["detail"]
    assert "container" in escapes["detail"]
    shown = subprocess.run([sys.executable, "-m", "coordinator", "status", "--url",
                            running.url], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, check=False)
    assert f"escapes     not watched for: pid {sleeper.pid}:" in shown.stdout
    with running.client() as client:
        summary = client.get("/drain").json()
    assert summary["phase"] == "done"
    assert summary["drain"]["escapes"]["unwatched_roots"] == [sleeper.pid]
    assert sleeper.wait(timeout=60) == -signal.SIGTERM


def test_an_engine_with_a_unit_of_its_own_is_watched(janitor: ProcessJanitor,
                                                     tmp_path: Path) -> None:
    """1. a sleep in a mount namespace of its own, registered; 2. ``/status`` and the drain's
       summary have no ``escapes``: its unit is watched."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    with engine_unit("mntns", janitor) as unit:
        sleeper = janitor.spawn([*unit.prefix, "sleep", "600"], cwd="/")
        comm = Path(f"/proc/{sleeper.pid}/comm")
        wait_for(lambda: comm.read_text().strip() == "sleep" or None, what="sleep running")
        unit.note(sleeper.pid)
        assert unit.mnt != {str(Path("/proc/self/ns/mnt").readlink())}
        register(running, sleeper.pid)
        wait_for(lambda: any(p["pid"] == sleeper.pid for p in running.status()["processes"])
                 or None, what="the worker listed")
        assert running.status()["escapes"] is None
        with running.client() as client:
            summary = client.get("/drain").json()
        assert summary["phase"] == "done"
        assert summary["drain"]["escapes"] is None
        sleeper.wait(timeout=60)
