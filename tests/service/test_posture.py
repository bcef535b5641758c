"""Secure defaults: settings that would leave the API open refuse the start with a message
naming the flag; the posture a coordinator does serve with is logged and shown in ``/status``;
the OpenAPI schema needs the token like every call but the probes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator import exit_codes
from coordinator.service import posture, sock_diag
from coordinator.settings import Settings
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


def refusal(**fields: Any) -> str:
    """The message ``posture.check`` refuses these settings with (the check ``serve`` makes
    before it listens)."""
    with pytest.raises(posture.InsecureSettings) as refused:
        posture.check(Settings(**fields))
    return str(refused.value)


def test_an_empty_token_file_refuses_the_start(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. an empty token file; 2. ``serve --token-file`` it; 3. it exits 2 naming the flag
    and the file, and never listens."""
    token_file = tmp_path / "token"
    token_file.write_text("")
    out = refused_start(janitor, tmp_path, "--token-file", str(token_file))
    assert f"--token-file {token_file} is empty" in out


def test_a_token_file_of_whitespace_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  \n\t\n")
    assert f"--token-file {token_file} is empty" in refusal(token_file=token_file)


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8"])
def test_a_token_file_that_cannot_be_read_is_refused(tmp_path: Path, kind: str) -> None:
    """A token file that does not exist, is a directory, or is not UTF-8: refused, naming
    the flag and the file."""
    token_file = tmp_path / "token"
    if kind == "directory":
        token_file.mkdir()
    elif kind == "not-utf8":
        token_file.write_bytes(b"\xff\xfe secret")
    assert f"--token-file {token_file}: cannot be read" in refusal(token_file=token_file)


def test_an_empty_token_variable_is_refused() -> None:
    """``SHUTDOWN_COORDINATOR_TOKEN`` set to whitespace is refused, not read as "no auth"."""
    assert "SHUTDOWN_COORDINATOR_TOKEN is set but empty" in refusal(token="   ")


def test_a_network_address_without_a_token_refuses_the_start(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. ``serve --host 0.0.0.0``, no token; 2. it exits 2 naming ``--host``,
    ``--token-file`` and the opt-out flag, and never listens."""
    out = refused_start(janitor, tmp_path, "--host", "0.0.0.0")
    assert "--host 0.0.0.0 is reachable from other hosts and no token is set" in out
    assert "--token-file" in out
    assert "--allow-unauthenticated-network" in out


@pytest.mark.parametrize("host", ["::", "10.0.0.7", "pod.example"])
def test_other_non_loopback_hosts_without_a_token_are_refused(host: str) -> None:
    assert f"--host {host} is reachable" in refusal(host=host)
    assert posture.check(Settings(host=host, allow_unauthenticated_network=True)).auth is False


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    assert posture.check(Settings(host=host)).loopback


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
        "hosts": security["hosts"], "enforced": security["enforced"],
        "token_file": security["token_file"],
    }
    assert "any IP address" in security["hosts"]
    assert "localhost" in security["hosts"]
    assert security["token_file"]["error"] is None
    assert set(security["enforced"]) >= {"register", "drain", "worker", "ack", "browsers"}
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



def test_without_a_token_a_host_forbidding_socket_diagnostics_refuses_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a token callers are told apart by their sockets (netlink sock_diag); where the
    host forbids it (seccomp, systemd's RestrictAddressFamilies) the start is refused in
    words naming both ways out, and with a token it is not needed."""
    monkeypatch.setattr(sock_diag, "available",
                        lambda: "PermissionError: Operation not permitted")
    with pytest.raises(posture.InsecureSettings, match="--token-file, or allow AF_NETLINK"):
        posture.check(Settings())
    assert posture.check(Settings(token="t")).auth
