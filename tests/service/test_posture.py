"""Secure defaults: settings that would leave the API open refuse the start with a message
naming the flag; the posture a coordinator does serve with is logged and shown in ``/status``;
the OpenAPI schema needs the token like every call but the probes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from coordinator import exit_codes
from tests.service.servers import ROOT, start_coordinator
from tests.support.processes import ProcessJanitor

TOKEN = "posture-token"


def refused_start(janitor: ProcessJanitor, tmp_path: Path, *args: str,
                  env: dict[str, str] | None = None) -> str:
    """Run ``serve`` with ``args``; assert it exits with the usage code without ever
    listening (no port file), and return what it printed."""
    port_file = tmp_path / "port.json"
    proc = janitor.spawn_python(
        ["-m", "coordinator", "serve", "--port", "0", "--port-file", str(port_file), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.USAGE, out
    assert not port_file.exists(), out
    return str(out)


@pytest.mark.parametrize("content", ["", "  \n\t\n"], ids=["empty", "whitespace"])
def test_an_empty_token_file_refuses_the_start(janitor: ProcessJanitor, tmp_path: Path,
                                               content: str) -> None:
    """1. a token file that is empty, or holds only whitespace; 2. ``serve --token-file`` it;
    3. it exits 2 naming the flag and the file, and never listens."""
    token_file = tmp_path / "token"
    token_file.write_text(content)
    out = refused_start(janitor, tmp_path, "--token-file", str(token_file))
    assert f"--token-file {token_file} is empty" in out


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8"])
def test_a_token_file_that_cannot_be_read_refuses_the_start(
    janitor: ProcessJanitor, tmp_path: Path, kind: str
) -> None:
    """1. a token file that does not exist, is a directory, or is not UTF-8; 2. ``serve``;
    3. it exits 2 naming the flag and the file, and never listens."""
    token_file = tmp_path / "token"
    if kind == "directory":
        token_file.mkdir()
    elif kind == "not-utf8":
        token_file.write_bytes(b"\xff\xfe secret")
    out = refused_start(janitor, tmp_path, "--token-file", str(token_file))
    assert f"--token-file {token_file}: cannot be read" in out


def test_an_empty_token_variable_refuses_the_start(janitor: ProcessJanitor,
                                                   tmp_path: Path) -> None:
    """``SHUTDOWN_COORDINATOR_TOKEN`` set to whitespace is refused, not read as "no auth"."""
    env = {**_environ(), "SHUTDOWN_COORDINATOR_TOKEN": "   "}
    out = refused_start(janitor, tmp_path, env=env)
    assert "SHUTDOWN_COORDINATOR_TOKEN is set but empty" in out


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_network_address_without_a_token_refuses_the_start(
    janitor: ProcessJanitor, tmp_path: Path, host: str
) -> None:
    """1. ``serve --host`` a wildcard address, no token; 2. it exits 2 naming ``--host``,
    ``--token-file`` and the opt-out flag, and never listens."""
    out = refused_start(janitor, tmp_path, "--host", host)
    assert f"--host {host} is reachable from other hosts and no token is set" in out
    assert "--token-file" in out
    assert "--allow-unauthenticated-network" in out


def test_the_opt_out_serves_the_network_and_says_so(janitor: ProcessJanitor,
                                                    tmp_path: Path) -> None:
    """1. ``serve --host 0.0.0.0 --allow-unauthenticated-network``; 2. it serves, logs a
    warning with the posture, and ``/status`` shows auth off on a non-loopback address."""
    running = start_coordinator(janitor, tmp_path, "--host", "0.0.0.0",
                                "--allow-unauthenticated-network")
    security = running.status()["security"]
    assert security["auth"] is False
    assert security["host"] == "0.0.0.0"
    assert security["loopback"] is False
    assert security["unauthenticated_network"] is True
    assert "security: auth OFF; bind 0.0.0.0 (NOT loopback)" in running.log.read_text()


def test_the_posture_is_logged_and_shown(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. ``serve`` with a token and a confinement, at log level info; 2. the start logs the
    posture; 3. ``/status`` shows it (never the token)."""
    running = start_coordinator(janitor, tmp_path, "--log-level", "info", "--confine-to-pid",
                                "1", token=TOKEN)
    document = running.status()
    security = document["security"]
    assert security == {
        "auth": True, "host": "127.0.0.1", "loopback": True, "confine_to_pid": 1,
        "unauthenticated_network": False, "registration": security["registration"],
    }
    assert "descendants of PID 1" in security["registration"]
    assert TOKEN not in str(document)
    log = running.log.read_text()
    assert "security: auth on; bind 127.0.0.1 (loopback)" in log
    assert TOKEN not in log


def test_the_schema_needs_the_token_and_no_cdn_pages_are_served(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """``/openapi.json`` answers 401 without the token and the schema with it; ``/docs`` and
    ``/redoc`` do not exist."""
    running = start_coordinator(janitor, tmp_path, token=TOKEN)
    assert httpx.get(running.url + "/openapi.json", timeout=30).status_code == 401
    with running.client() as client:
        schema = client.get("/openapi.json")
        assert schema.status_code == 200
        assert "/drain" in schema.json()["paths"]
        assert client.get("/docs").status_code == 404
        assert client.get("/redoc").status_code == 404


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SHUTDOWN_COORDINATOR_")}
