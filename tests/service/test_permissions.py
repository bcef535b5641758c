"""Without a token, a caller may register only a process it could signal itself: another
user's process (root's above all) cannot be handed to the next drain's SIGKILL by whoever
can reach the port. With the token, the caller is trusted."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.service.servers import Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
REGISTER = """
import json, sys, urllib.error, urllib.request
url, pid, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
headers = {"content-type": "application/json"}
if token:
    headers["authorization"] = "Bearer " + token
request = urllib.request.Request(url + "/workers", data=json.dumps({"pid": pid}).encode(),
                                 headers=headers, method="POST")
try:
    with urllib.request.urlopen(request, timeout=30) as answer:
        print(json.dumps({"status": answer.status, "body": json.load(answer)}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": json.load(error)}))
"""


def register_as_nobody(janitor: ProcessJanitor, running: Running, pid: int,
                       token: str = "") -> dict[str, Any]:
    """``POST /workers {"pid": pid}`` from a process of UID 65534 (the system's Python,
    standard library only); its answer."""
    proc = janitor.spawn([*AS_NOBODY, "/usr/bin/python3", "-c", REGISTER, running.url,
                          str(pid), token], cwd="/", stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    answer: dict[str, Any] = json.loads(out)
    return answer


def sleeper(janitor: ProcessJanitor, *, as_nobody: bool = False) -> int:
    """A sleeping process of root, or of UID 65534 (once ``setpriv`` has switched to it)."""
    argv = [*AS_NOBODY, "sleep", "600"] if as_nobody else ["sleep", "600"]
    pid = janitor.spawn(argv, cwd="/", service=True, exit_code=-signal.SIGTERM).pid
    if as_nobody:
        wait_for(lambda: _uid(pid) == NOBODY or None, what="the sleeper running as 65534")
    return pid


def test_without_a_token_only_processes_the_caller_could_signal(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator without a token; a sleeper of root and one of UID 65534;
    2. UID 65534 registering root's sleeper is refused (403, naming both UIDs), and nothing
       is registered; 3. it may register its own; 4. root may register any (it could signal
       it); 5. the processes' owners are what /proc says."""
    running = start_coordinator(janitor, tmp_path)
    roots_sleeper, nobodys_sleeper = sleeper(janitor), sleeper(janitor, as_nobody=True)
    assert _uid(roots_sleeper) == 0
    assert _uid(nobodys_sleeper) == NOBODY

    refused = register_as_nobody(janitor, running, roots_sleeper)
    assert refused["status"] == 403, refused
    assert "belongs to UID 0 and the caller is UID 65534" in refused["body"]["detail"]
    assert running.status()["workers"] == []

    own = register_as_nobody(janitor, running, nobodys_sleeper)
    assert own["status"] == 201, own
    with running.client() as client:
        answer = client.post("/workers", json={"pid": roots_sleeper})
    assert answer.status_code == 201, answer.text
    assert sorted(w["pid"] for w in running.status()["workers"]) == sorted(
        [roots_sleeper, nobodys_sleeper])
    assert "own user" in running.status()["security"]["registration"]


def test_with_the_token_the_caller_is_trusted(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """With a token, UID 65534 holding it may register root's process; without it, 401."""
    running = start_coordinator(janitor, tmp_path, token="perm-token")
    roots_sleeper = sleeper(janitor)
    assert register_as_nobody(janitor, running, roots_sleeper)["status"] == 401
    trusted = register_as_nobody(janitor, running, roots_sleeper, "perm-token")
    assert trusted["status"] == 201, trusted
    assert [w["pid"] for w in running.status()["workers"]] == [roots_sleeper]


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
