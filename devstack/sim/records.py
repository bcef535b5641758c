"""End records: each process of the simulated engine says how it ended, in its own file.

``<record-dir>/<role>-<pid>.json`` is written atomically (temporary file, then rename) at
three moments: when the process is up (``cleanup: "not started"``), when its cleanup starts
(``"started"``) and when it ends (``"finished"``, or ``"interrupted"`` when it abandoned its
own cleanup, as the stock main process does). A file still saying ``started`` (or ``not
started`` after a signal) belongs to a process that was killed before it could finish.

Request records (``RequestLog``, ``read_requests``): what reached an engine and when, one
line per request's arrival and end, for checks of where a router sent what (the engine run
by ``devstack.local_stack``'s pods writes them; ``read_records`` does not list them).
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


# --- request records: what reached an engine, and when --------------------------------------

REQUEST_LOG_PREFIX = "requests-"
"""``<record-dir>/requests-<pid>.jsonl``: one engine process's request log (``RequestLog``)."""


class RequestLog:
    """Every request one engine process received, appended as it happens, one JSON line per
    event: ``{"event": "arrived", "serial", "request_id", "prompt", "max_tokens", "at",
    "at_monotonic"}`` when the HTTP handler takes the request, ``{"event": "ended", "serial",
    "tokens", "how", "at", "at_monotonic"}`` when its stream ends (``how``: ``done``,
    ``handed_back``, ``aborted`` (the engine's abort call ended it), or ``cut`` when the client or
the process went away first).

    ``at`` is epoch seconds (the coordinator's ``/status`` times are too), ``at_monotonic``
    ``time.monotonic()``, one clock for every process of the host. Each line is one
    ``write`` to a file opened with ``O_APPEND``, so a reader sees whole lines only, even
    while the engine runs; a process killed mid-stream leaves its arrival without an end.
    """

    def __init__(self, record_dir: Path | str) -> None:
        self.path = Path(record_dir) / f"{REQUEST_LOG_PREFIX}{os.getpid()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._serial = 0

    def arrived(self, request_id: str, prompt: str, max_tokens: int) -> int:
        """Note a request the moment it is taken; returns its serial for ``ended``."""
        self._serial += 1
        self._write({"event": "arrived", "serial": self._serial, "request_id": request_id,
                     "prompt": prompt, "max_tokens": max_tokens})
        return self._serial

    def ended(self, serial: int, tokens: int, how: str) -> None:
        self._write({"event": "ended", "serial": serial, "tokens": tokens, "how": how})

    def _write(self, line: dict[str, Any]) -> None:
        line.update(at=time.time(), at_monotonic=time.monotonic())
        os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())


def read_requests(record_dir: Path | str) -> list[dict[str, Any]]:
    """Every request the engine's processes logged (``RequestLog``), in arrival order: one
    dict each with ``pid``, ``serial``, ``request_id``, ``prompt``, ``max_tokens``,
    ``arrived_at``, ``arrived_at_monotonic`` and, once its stream ended, ``ended_at``,
    ``ended_at_monotonic``, ``tokens`` and ``how`` (None before)."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for path in Path(record_dir).glob(f"{REQUEST_LOG_PREFIX}*.jsonl"):
        pid = int(path.stem.removeprefix(REQUEST_LOG_PREFIX))
        for text in path.read_text().splitlines():
            line = json.loads(text)
            key = (pid, line["serial"])
            if line["event"] == "arrived":
                found[key] = {"pid": pid, "serial": line["serial"],
                              "request_id": line["request_id"], "prompt": line["prompt"],
                              "max_tokens": line["max_tokens"], "arrived_at": line["at"],
                              "arrived_at_monotonic": line["at_monotonic"], "ended_at": None,
                              "ended_at_monotonic": None, "tokens": None, "how": None}
            elif key in found:
                found[key].update(ended_at=line["at"], ended_at_monotonic=line["at_monotonic"],
                                  tokens=line["tokens"], how=line["how"])
    return sorted(found.values(), key=lambda r: r["arrived_at_monotonic"])
