"""Lax input is refused: every field of its own JSON type (no ``"10"`` for a number, no
``"no"`` or ``1`` for a boolean, no ``true`` for a PID), no control character in a URL; and
what a caller or a process names itself is shown, not obeyed: a bidirectional control or an
escape sequence reaches neither the page, the drawing nor the terminal raw.

Each refusal is judged on what the coordinator then holds (no drain started, nothing
registered), each view on its bytes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.servers import FAST, ROOT, register, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

BIDI = "evil\u202egnp.exe"
ESCAPE = "red\x1b[31mtext"


@pytest.mark.parametrize(("path", "body"), [
    ("/drain", {"deadline_s": "10", "wait": False}),
    ("/drain", {"wait": "no"}),
    ("/drain", {"wait": False, "force": 1}),
    ("/drain", {"wait": 0}),
    ("/workers", {"pid": True}),
    ("/workers", {"pid": "1"}),
    ("/workers", {"pid": 1.0}),
    ("/workers", {"pid": 2, "include_tree": "yes"}),
    ("/workers", {"pid": 2, "url": "http://127.0.0.1:1/\r\nX-Injected: 1"}),
    ("/workers", {"pid": 2, "url": "http://127.0.0.1:1/\nx"}),
    ("/workers", {"pid": 2, "url": "http://127.0.0.1:1/ x"}),
    ("/migrations/ack", {"request_ids": [1]}),
])
def test_lax_values_are_refused(janitor: ProcessJanitor, tmp_path: Path, path: str,
                                body: dict[str, object]) -> None:
    """1. a coordinator; 2. a body with a value of the wrong JSON type (or a URL with a
       control character) is 422 naming the field; 3. no drain started, nothing
       registered."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    with running.client() as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    document = running.status()
    assert document["phase"] == "serving"
    assert document["workers"] == []


def test_strict_values_of_the_right_type_are_taken(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """An integer is a number: ``{"deadline_s": 10, "wait": false}`` starts a drain of 10 s."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    with running.client() as client:
        answer = client.post("/drain", json={"deadline_s": 10, "wait": False})
        assert answer.status_code == 202, answer.text
        assert answer.json()["drain"]["budget_s"] == 10


def test_a_group_members_url_with_cr_lf_is_refused(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """A group's leader refuses a follower's ``url`` holding CR/LF (422), and takes a clean
    one."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--group-size", "2",
                                "--group-index", "0")
    with running.client() as client:
        refused = client.post("/group/members",
                              json={"index": 1, "url": "http://10.0.0.2:8787\r\nX-A: b"})
        assert refused.status_code == 422, refused.text
        taken = client.post("/group/members", json={"index": 1, "url": "http://10.0.0.2:8787"})
        assert taken.status_code == 200, taken.text


def test_a_url_setting_with_a_newline_refuses_the_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "serve", "--router", "smg=http://127.0.0.1:1",
         "--router-worker-url", "http://127.0.0.1:2\nX-A: b"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "control character" in done.stderr


def test_bidi_controls_and_escapes_are_shown_escaped_everywhere(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a worker whose role holds U+202E and whose command line an ANSI escape;
    2. the timeline page and its SVG hold neither raw character, and show ``\\u202e``;
    3. ``shutdown-coordinator status`` prints neither raw, and shows both escaped."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    sleeper = janitor.spawn(["bash", "-c", 'exec -a "$0" sleep 600', ESCAPE], cwd="/",
                            service=True, exit_code=-signal.SIGTERM).pid
    register(running, sleeper, role=BIDI)
    wait_for(lambda: any(p["role"] == BIDI for p in running.status()["processes"]) or None,
             what="the worker's process listed")
    for form in ("html", "svg"):
        drawn = httpx.get(running.url + "/status/timeline", params={"format": form},
                          timeout=60).text
        assert "\u202e" not in drawn
        assert "\x1b" not in drawn
    page = httpx.get(running.url + "/status/timeline", timeout=60).text
    assert "evil\\u202egnp.exe" in page
    shown = subprocess.run([sys.executable, "-m", "coordinator", "status", "--url",
                            running.url], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "\u202e" not in shown.stdout
    assert "\x1b" not in shown.stdout
    assert "evil\\u202egnp.exe" in shown.stdout
    assert "red\\x1b[31mtext" in shown.stdout
