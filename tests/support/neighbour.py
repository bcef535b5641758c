"""A real unprivileged user on the test host: the neighbour a shared host has.

``neighbour(janitor)`` returns a ``Neighbour`` for the system account ``sc-neighbour``, made
with ``useradd`` the first time (CI runs the tests as root); the test is skipped where they
do not run as root or ``useradd``/``setpriv`` are missing. The account has no home and no
login shell, and is left in place for the next test (xdist workers share it; a lock file
keeps two of them from adding it at once).

The neighbour's processes are started with ``setpriv`` (real, effective and saved UID and GID
switched, supplementary groups cleared), so the kernel, ``/proc`` and every socket they open
say they are that user's. Its HTTP calls run the system's Python with the standard library
alone, from ``/``: nothing of the test's environment is lent to it.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ProcessJanitor, wait_for

NAME = "sc-neighbour"
LOCK = Path("/tmp/.sc-neighbour.lock")
PYTHON = "/usr/bin/python3"
CALL = """
import json, sys, urllib.error, urllib.request
url, method, body, headers = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
data = body.encode() if body else None
if data is not None:
    headers.setdefault("content-type", "application/json")
request = urllib.request.Request(url, data=data, headers=headers, method=method)
try:
    with urllib.request.urlopen(request, timeout=120) as answer:
        status, text = answer.status, answer.read().decode()
except urllib.error.HTTPError as error:
    status, text = error.code, error.read().decode()
try:
    parsed = json.loads(text)
except ValueError:
    parsed = text
print(json.dumps({"status": status, "body": parsed}))
"""


@dataclass(frozen=True)
class Neighbour:
    """An unprivileged user and the janitor that owns what it starts."""

    uid: int
    gid: int
    janitor: ProcessJanitor

    @property
    def prefix(self) -> list[str]:
        """Prepend to an argv to run it as the neighbour."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]

    def sleeper(self, *, service: bool = True) -> int:
        """A ``sleep`` of the neighbour's; its PID once it runs as the neighbour."""
        pid = self.janitor.spawn([*self.prefix, "sleep", "600"], cwd="/", service=service,
                                 exit_code=-signal.SIGTERM).pid
        wait_for(lambda: owner(pid) == self.uid or None, what="the sleeper running as the "
                 "neighbour")
        return pid

    def call(self, url: str, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> dict[str, Any]:
        """One HTTP call made by a process of the neighbour's: ``{"status", "body"}``."""
        text = "" if body is None else (body if isinstance(body, str) else json.dumps(body))
        proc = self.janitor.spawn([*self.prefix, PYTHON, "-c", CALL, url.rstrip("/") + path,
                                   method, text, json.dumps(headers or {})],
                                  cwd="/", stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
        answer: dict[str, Any] = json.loads(out)
        return answer


def neighbour(janitor: ProcessJanitor) -> Neighbour:
    """The unprivileged user, added when missing (see the module docstring)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to add an unprivileged user and run processes as it")
    for tool in ("useradd", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}(8) to make an unprivileged user")
    if not Path(PYTHON).exists():
        pytest.skip(f"no {PYTHON} for the unprivileged user's calls")
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entry = pwd.getpwnam(NAME)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                            "--shell", "/usr/sbin/nologin", NAME], check=True,
                           capture_output=True)
            entry = pwd.getpwnam(NAME)
    return Neighbour(entry.pw_uid, entry.pw_gid, janitor)


def owner(pid: int) -> int | None:
    """The real UID of ``pid`` per ``/proc``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return None


def alive(pid: int) -> bool:
    """Per ``/proc``: ``pid`` runs (a zombie has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"
