"""The kill engine and the init's reaper on one loop, in a process of its own:
``python -m tests.init.reaper_probe MODE RECORD_DIR``.

The probe is what ``shutdown-coordinator run`` is to its engine: a subreaper whose every
exited child is reaped at once (SIGCHLD → ``Reaper.reap``), running the kill engine on a tree
of its own children (``tests.kill.trees``):

    root (exit 3 on SIGTERM)
    ├── steady (exit 0)
    ├── selfkill (cleanup, then its own SIGKILL)
    └── mid ─── leaf (exit 5)      mid is SIGKILLed before the kill: leaf is reparented here

MODE says how hard the race is made, comma-separated:

- ``natural``: whichever of the exit's pidfd and the SIGCHLD the loop serves first;
- ``reap-first``: every exit is reaped before the kill engine reads its code (the SIGCHLD
  callback always wins);
- ``no-pidfd-info``: ``PIDFD_GET_INFO`` answers nothing, as on a kernel before 6.15;
- ``no-book``: the reaper's records are not read (the control that shows they matter).

It prints one JSON line: the tree (``ready.json``), the kill's report (pid → fate, exit
code), and what the reaper collected (pid → exit code).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from coordinator.init.reaper import Reaper, become_subreaper
from coordinator.kill import KillPolicy, Target, pidfd, reaped, terminate
from coordinator.kill.table import ProcessTable

TREE = {"role": "root", "exit_code": 3, "children": [
    {"role": "steady", "exit_code": 0},
    {"role": "selfkill", "sigkill_self": True},
    {"role": "mid", "children": [{"role": "leaf", "exit_code": 5}]},
]}


def wait_for_file(path: Path, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.01)
    return json.loads(path.read_text())


async def main(modes: set[str], record_dir: Path) -> dict[str, Any]:
    collected: dict[int, int] = {}
    reaper = Reaper(lambda found: collected.__setitem__(found.pid, found.exit_code))
    if "reap-first" in modes:
        plain = ProcessTable.mark_exited

        def reap_then_mark(table: ProcessTable, pid: int) -> None:
            reaper.reap()
            plain(table, pid)

        ProcessTable.mark_exited = reap_then_mark  # type: ignore[method-assign,assignment]
    if "no-pidfd-info" in modes:
        pidfd.reaped_exit_code = lambda _fd: None  # type: ignore[assignment]
    if "no-book" in modes:
        reaped.lookup = lambda _pid, _ticks: None  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, reaper.reap)
    root = subprocess.Popen(  # noqa: ASYNC220 - started once, before the loop has work
        [sys.executable, "-m", "tests.kill.trees", json.dumps(TREE), str(record_dir)],
        start_new_session=True)
    tree = wait_for_file(record_dir / "ready.json")
    mid = next(p["pid"] for p in tree if p["role"] == "mid")
    leaf = next(p["pid"] for p in tree if p["role"] == "leaf")
    fd = os.pidfd_open(mid)
    signal.pidfd_send_signal(fd, signal.SIGKILL)
    # The leaf is ours once its parent is gone (this process is a subreaper).
    deadline = time.monotonic() + 30
    while _ppid(leaf) != os.getpid():
        if time.monotonic() > deadline:
            raise SystemExit("the leaf was never reparented here")
        await asyncio.sleep(0.01)
    report = await terminate([Target(root.pid)],
                             KillPolicy(tier_timeout_s=10, deadline_s=30, confirm_s=2))
    deadline = time.monotonic() + 10
    while Reaper.has_children() and time.monotonic() < deadline:
        reaper.reap()
        await asyncio.sleep(0.01)
    os.close(fd)
    return {"tree": tree, "mid": mid, "leaf": leaf, "root": root.pid,
            "report": {str(p.pid): {"fate": p.fate.value, "exit_code": p.exit_code,
                                    "role": p.role, "detail": p.detail}
                       for p in report.processes},
            "reaped": {str(pid): code for pid, code in collected.items()}}


def _ppid(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(text[text.rindex(")") + 2:].split()[1])


if __name__ == "__main__":
    become_subreaper()
    found = asyncio.run(main(set(sys.argv[1].split(",")), Path(sys.argv[2])))
    print(json.dumps(found), flush=True)
