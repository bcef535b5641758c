"""The token file is followed: a rotated token works from its first request and the old one
stops; a file that turns empty or disappears keeps the last token in force and says so; a
token in any script works as clients send it (UTF-8), from curl-like clients and from the
command line and ``worker_client``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.service.servers import ROOT, Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

UTF8_TOKEN = "jeton-été-токен-令牌"


def _status_code(running: Running, token: str) -> int:
    headers = {b"Authorization": f"Bearer {token}".encode()}
    return httpx.get(running.url + "/status", headers=headers, timeout=30).status_code


def test_a_rotated_token_is_in_force_at_once_and_the_old_one_stops(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator with ``--token-file`` holding token A; 2. the file is replaced the way
       a Kubernetes Secret is (a new file, a symlink swapped): token B works on its first
       request, and A is refused (401) soon after; 3. ``/status`` counts the reload;
    4. the file is emptied, then deleted: B stays in force and ``security.token_file.error``
       says why; 5. a new file with token C: C works, B is refused, the error is gone."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "data-1").mkdir()
    (secret / "data-1" / "token").write_text("token-A\n")
    (secret / "..data").symlink_to("data-1")
    (secret / "token").symlink_to("..data/token")
    running = start_coordinator(janitor, tmp_path, "--token-file", str(secret / "token"))
    assert _status_code(running, "token-A") == 200
    assert _status_code(running, "token-B") == 401

    # 2.
    (secret / "data-2").mkdir()
    (secret / "data-2" / "token").write_text("token-B\n")
    (secret / "..data-new").symlink_to("data-2")
    os.replace(secret / "..data-new", secret / "..data")
    assert _status_code(running, "token-B") == 200
    wait_for(lambda: _status_code(running, "token-A") == 401 or None,
             what="the old token refused")
    # 3.
    document = httpx.get(running.url + "/status", timeout=30, headers={
        b"Authorization": b"Bearer token-B"}).json()
    token_file = document["security"]["token_file"]
    assert token_file["reloads"] == 1
    assert token_file["error"] is None
    assert "token-B" not in str(document)

    # 4.
    (secret / "data-2" / "token").write_text("  \n")

    def error(token: str = "token-B") -> str | None:
        found = httpx.get(running.url + "/status", timeout=30, headers={
            b"Authorization": f"Bearer {token}".encode()}).json()["security"]["token_file"]
        return str(found["error"]) if found["error"] else None

    assert "is empty" in wait_for(error, what="the empty token file reported")
    (secret / "data-2" / "token").unlink()
    assert "cannot be read" in wait_for(
        lambda: (e := error()) and "cannot be read" in e and e, what="the deleted file")
    assert _status_code(running, "token-B") == 200

    # 5.
    (secret / "data-2" / "token").write_text("token-C")
    assert _status_code(running, "token-C") == 200
    assert _status_code(running, "token-B") == 401
    assert wait_for(lambda: error("token-C") is None or None, what="the error cleared")


def test_a_utf8_token_works_from_every_client(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a coordinator whose token file holds a token in four scripts; 2. sent as its UTF-8
       bytes (curl, Go) it is accepted, a wrong one refused; 3. ``shutdown-coordinator
       status`` with the same token file answers; 4. ``worker_client`` registers with it."""
    token_file = tmp_path / "token"
    token_file.write_text(UTF8_TOKEN + "\n", encoding="utf-8")
    running = start_coordinator(janitor, tmp_path, "--token-file", str(token_file))
    assert _status_code(running, UTF8_TOKEN) == 200
    assert _status_code(running, UTF8_TOKEN + "x") == 401

    status = subprocess.run(
        [sys.executable, "-m", "coordinator", "status", "--url", running.url, "--json",
         "--token-file", str(token_file)], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False)
    assert status.returncode == 0, status.stderr
    assert '"phase": "serving"' in status.stdout

    register = (
        "import os, sys\n"
        "from worker_client._http import call_once\n"
        "from shutdown_wire import bearer_header\n"
        "answer = call_once(sys.argv[1], bearer_header(sys.argv[2]), 'POST', '/workers',\n"
        "                   {'pid': os.getpid()})\n"
        "print(answer.status)\n")
    out = subprocess.run([sys.executable, "-c", register, running.url, UTF8_TOKEN], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout.strip() == "201", out.stderr
