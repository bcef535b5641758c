"""End records: each process of the simulated engine says how it ended, in its own file.

``<record-dir>/<role>-<pid>.json`` is written atomically (temporary file, then rename) at
three moments: when the process is up (``cleanup: "not started"``), when its cleanup starts
(``"started"``) and when it ends (``"finished"``, or ``"interrupted"`` when it abandoned its
own cleanup, as the stock main process does). A file still saying ``started`` (or ``not
started`` after a signal) belongs to a process that was killed before it could finish.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

from devstack.sim.roles import Role

CLEANUP_NOT_STARTED = "not started"
CLEANUP_STARTED = "started"
CLEANUP_FINISHED = "finished"
CLEANUP_INTERRUPTED = "interrupted"

_RECORD_NAME = re.compile(r"^(?P<role>[a-z_]+)-(?P<pid>\d+)\.json$")


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader sees either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class RecordWriter:
    """The end record of the calling process, rewritten whole at every change."""

    def __init__(self, record_dir: Path | str, role: Role, *, rank: int | None = None) -> None:
        self.path = Path(record_dir) / f"{role.value}-{os.getpid()}.json"
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {
            "role": role.value,
            "rank": rank,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "started_at": time.time(),
            "pdeathsig": None,
            "signal": None,
            "signals": [],
            "signalled_at": None,
            "cleanup": CLEANUP_NOT_STARTED,
            "cleanup_started_at": None,
            "cleanup_finished_at": None,
            "ended_at": None,
            "exit_code": None,
            "children": [],
            "detail": "",
        }

    def update(self, **changes: Any) -> None:
        # The main process writes from its event loop and from its watchdog thread.
        with self._lock:
            self.data.update(changes)
            write_json_atomically(self.path, self.data)

    def signalled(self, signum: int) -> None:
        """Note a received signal (the first one is also kept as ``signal``)."""
        name = signal_name(signum)
        changes: dict[str, Any] = {"signals": [*self.data["signals"], name]}
        if self.data["signal"] is None:
            changes.update(signal=name, signalled_at=time.time())
        self.update(**changes)

    def cleanup_started(self, detail: str = "") -> None:
        self.update(cleanup=CLEANUP_STARTED, cleanup_started_at=time.time(), detail=detail)

    def ended(self, exit_code: int, *, cleanup: str = CLEANUP_FINISHED, detail: str = "") -> None:
        now = time.time()
        changes: dict[str, Any] = {"cleanup": cleanup, "ended_at": now, "exit_code": exit_code}
        if cleanup == CLEANUP_FINISHED:
            changes["cleanup_finished_at"] = now
        if detail:
            changes["detail"] = detail
        self.update(**changes)


def read_records(record_dir: Path | str) -> list[dict[str, Any]]:
    """Every end record in ``record_dir``, oldest process first."""
    out: list[dict[str, Any]] = []
    for path in Path(record_dir).iterdir():
        if not _RECORD_NAME.match(path.name):
            continue
        try:
            out.append(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # replaced between listing and reading; the rename keeps it whole
    out.sort(key=lambda r: (r.get("started_at") or 0.0, r.get("pid") or 0))
    return out
