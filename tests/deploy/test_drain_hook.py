"""The preStop drain hook (deploy/kubernetes/base/drain_hook.py), run as a real process
against a real HTTP server on loopback.

The server here stands in for a coordinator whose drain outcome the test chooses (a drain
that needed SIGKILL, a refused token); tests/deploy/test_drain_hook_live.py runs the hook
against the real coordinator.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.rendering import DRAIN_HOOK
from tests.support.processes import ProcessJanitor, wait_for

HOOK_EXIT_S = 30.0
TOKEN = "s3cret-token"


@dataclass
class FakeDrain:
    """What the server answers to GET /drain, and what it was asked."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    hold: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)


def _handler(drain: FakeDrain) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            drain.requests.append(("GET", self.path, self.headers.get("Authorization")))
            drain.arrived.set()
            # A real GET /drain blocks until the drain is done.
            drain.hold.wait(HOOK_EXIT_S)
            payload = json.dumps(drain.body).encode()
            self.send_response(drain.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def drain() -> FakeDrain:
    return FakeDrain(body={"phase": "done", "processes": []})


def _serve(drain: FakeDrain, port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(drain))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def server(drain: FakeDrain) -> Iterator[ThreadingHTTPServer]:
    srv = _serve(drain)
    try:
        yield srv
    finally:
        drain.hold.set()
        srv.shutdown()
        srv.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def _run_hook(
    janitor: ProcessJanitor, args: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return janitor.spawn(
        [sys.executable, str(DRAIN_HOOK), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=HOOK_EXIT_S)
    return proc.returncode, out.decode()


def test_hook_blocks_until_the_drain_is_done(
    janitor: ProcessJanitor, server: ThreadingHTTPServer, drain: FakeDrain, token_file: Path
) -> None:
    """1. Start the hook with the coordinator's URL and token in its environment (as the pod
       spec sets them).
    2. Wait until its GET /drain arrives; it carries the token as a Bearer header.
    3. The hook is still running while the drain runs.
    4. Finish the drain gracefully: the hook prints the summary and exits 0.
    """
    proc = _run_hook(
        janitor,
        [],
        env={
            "SHUTDOWN_COORDINATOR_URL": _url(server),
            "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(token_file),
        },
    )
    assert drain.arrived.wait(HOOK_EXIT_S)
    assert drain.requests == [("GET", "/drain", f"Bearer {TOKEN}")]
    assert proc.poll() is None
    drain.body = {
        "phase": "done",
        "outcome": "graceful",
        "processes": [{"pid": 7, "name": "scheduler", "fate": "exited", "exit_code": 0}],
    }
    drain.hold.set()
    code, out = _finish(proc)
    assert code == 0, out
    assert "phase=done" in out
    assert "exited=1" in out


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"phase": "done", "processes": [{"pid": 8, "name": "w", "fate": "killed"}]}, 3),
        ({"phase": "done", "processes": [{"pid": 8, "name": "w", "fate": "survived"}]}, 4),
        ({"phase": "done", "outcome": "killed", "processes": []}, 3),
        ({"phase": "done", "outcome": "timeout", "processes": []}, 4),
        ({"phase": "serving", "processes": []}, 5),
        ({"phase": "done", "outcome": "signalled",
          "drain": {"causes": ["pid 8 (w) died of SIGKILL"]},
          "processes": [{"pid": 8, "name": "w", "fate": "exited", "exit_code": -9}]}, 9),
        ({"phase": "done", "outcome": "lost_requests",
          "drain": {"causes": ["2 handed-back requests were never acknowledged"],
                    "lost_requests": 2},
          "processes": [{"pid": 8, "name": "w", "fate": "exited", "exit_code": 0}]}, 11),
    ],
    ids=["fate-killed", "fate-survived", "outcome-killed", "outcome-timeout", "aborted",
         "outcome-signalled", "outcome-lost-requests"],
)
def test_hook_exit_code_tells_how_the_drain_ended(
    janitor: ProcessJanitor,
    server: ThreadingHTTPServer,
    drain: FakeDrain,
    token_file: Path,
    body: dict[str, Any],
    expected: int,
) -> None:
    """1. The coordinator's summary says how the processes ended.
    2. The hook exits with the code `shutdown-coordinator drain` uses for that outcome, and
       names what needed SIGKILL (what a FailedPreStopHook event shows).
    """
    drain.body = body
    drain.hold.set()
    proc = _run_hook(janitor, ["--url", _url(server), "--token-file", str(token_file)])
    code, out = _finish(proc)
    assert code == expected, out
    if any(p.get("fate") in ("killed", "survived") for p in body["processes"]):
        assert "not graceful: 8(w)" in out
    for cause in body.get("drain", {}).get("causes", ()):
        assert cause in out


def test_hook_reports_a_refused_token(
    janitor: ProcessJanitor, server: ThreadingHTTPServer, drain: FakeDrain, token_file: Path
) -> None:
    """1. The coordinator answers 401 (wrong token).
    2. The hook exits 7 and says the token was refused.
    """
    drain.status = 401
    drain.body = {"detail": "bad token"}
    drain.hold.set()
    code, out = _finish(
        _run_hook(janitor, ["--url", _url(server), "--token-file", str(token_file)])
    )
    assert code == 7, out
    assert "token refused" in out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_hook_gives_up_when_nothing_listens(janitor: ProcessJanitor) -> None:
    """1. Nothing listens on the coordinator's port and the hook may not retry.
    2. It exits 6 at once, so the kubelet goes on to SIGTERM.
    """
    port = _free_port()
    code, out = _finish(
        _run_hook(janitor, ["--url", f"http://127.0.0.1:{port}", "--connect-retry", "0"])
    )
    assert code == 6, out
    assert "unreachable" in out


def test_hook_waits_for_a_restarting_coordinator(
    janitor: ProcessJanitor, drain: FakeDrain, token_file: Path
) -> None:
    """1. Something holds the coordinator's port but is going away (a coordinator container
       restarting): it accepts the hook's first connection and resets it unanswered.
    2. Only then does the coordinator come back on that port.
    3. The hook retried: its second attempt reaches the coordinator, the drain completes,
       exit 0; the coordinator got exactly one GET /drain (the reset attempt never reached
       it).
    """
    port = _free_port()
    with socket.socket() as going_away:
        going_away.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        going_away.bind(("127.0.0.1", port))
        going_away.listen(1)
        going_away.settimeout(HOOK_EXIT_S)
        proc = _run_hook(
            janitor,
            ["--url", f"http://127.0.0.1:{port}", "--token-file", str(token_file)],
        )
        first, _ = going_away.accept()
        # Linger 0: close with a reset, as a dying process's sockets are.
        first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        first.close()
    assert proc.poll() is None
    srv = _serve(drain, port)
    try:
        drain.hold.set()
        code, out = _finish(proc)
        assert code == 0, out
        assert drain.requests == [("GET", "/drain", f"Bearer {TOKEN}")]
    finally:
        srv.shutdown()
        srv.server_close()


def test_hook_without_token_file_sends_no_header(
    janitor: ProcessJanitor, server: ThreadingHTTPServer, drain: FakeDrain
) -> None:
    """1. No token configured (a coordinator without a token).
    2. GET /drain goes out without an Authorization header.
    """
    drain.hold.set()
    code, out = _finish(_run_hook(janitor, ["--url", _url(server)]))
    assert code == 0, out
    wait_for(lambda: drain.requests, what="the hook's request")
    assert drain.requests == [("GET", "/drain", None)]
