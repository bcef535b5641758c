"""``--public-host``: the probes and the metrics on the pod's address, the API on loopback."""

from __future__ import annotations

import ipaddress
import json
import signal
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from coordinator import exit_codes
from coordinator.cli import main
from tests.init.wrapper import start_wrapper
from tests.support.processes import ProcessJanitor, wait_for


def _own_address() -> str:
    """A non-loopback IPv4 address of this host (the role the pod's IP plays)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name == "AF_INET" and not ipaddress.ip_address(
                    address.address).is_loopback:
                return str(address.address)
    pytest.skip("this host has no address but loopback")


def test_only_the_public_routes_answer_on_the_public_address(janitor: ProcessJanitor,
                                                              tmp_path: Path) -> None:
    """1. Run a recorder under the wrapper with ``--public-host`` set to an address of this
       host (as the pod's IP from the downward API).
    2. On that address, with no token configured: /healthz, /readyz and /metrics answer;
       /status, GET /drain and POST /drain are refused with a JSON 403 and start nothing.
    3. On loopback the whole API answers.
    4. SIGTERM drains as usual: the recorder exits 0, so does the wrapper."""
    address = _own_address()
    wrapper = start_wrapper(janitor, tmp_path, [sys.executable, "-m", "tests.init.recorder",
                                                str(tmp_path)], "--public-host", address)
    loopback = wrapper.url()
    port = int(loopback.rsplit(":", 1)[1])
    public = f"http://{address}:{port}"
    wait_for(lambda: (tmp_path / "ready.json").exists(), what="the recorder ready")
    with httpx.Client(timeout=30) as client:
        assert client.get(public + "/healthz").status_code == 200
        assert client.get(public + "/readyz").json()["ready"] is True
        assert "shutdown_coordinator" in client.get(public + "/metrics").text
        for method, path in (("GET", "/status"), ("GET", "/drain"), ("POST", "/drain")):
            refused = client.request(method, public + path)
            assert refused.status_code == 403, (method, path, refused.text)
            assert "loopback" in refused.json()["detail"]
        status = client.get(loopback + "/status").json()
        assert status["phase"] == "serving"
    ready = json.loads((tmp_path / "ready.json").read_text())
    wrapper.proc.send_signal(signal.SIGTERM)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    assert json.loads((tmp_path / f"main-{ready['main']}.json").read_text())["exit_code"] == 0


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::", "pod-ip"])
def test_a_public_host_that_is_no_pod_address_is_refused(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Loopback, a wildcard or a name is refused with the usage code, before anything
    starts, saying why."""
    assert main(["run", "--public-host", value, "--", "true"]) == exit_codes.USAGE
    assert "public" in capsys.readouterr().err
