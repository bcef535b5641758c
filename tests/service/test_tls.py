"""The coordinator's HTTP clients: the CA bundle only for https URLs, and a plain-http client
that meets TLS fails closed (``coordinator/tls.py``)."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coordinator.tls import verify_for

# A self-signed certificate for 127.0.0.1 (EC P-256, valid until 2126), made for this test.
CERT = """-----BEGIN CERTIFICATE-----
MIIBjzCCATagAwIBAgIUMwUSWsuOv7zThlcKeIDQfnh6EJIwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTI2MTIwNDA3NTQyNloYDzIxMjYxMTEw
MDc1NDI2WjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQKQrey6ELeKgsOwaygBvLeUK+AC3QZwRHmOE0gTNuuhMtHYXjj/h49
x32l+hHlaoHY7TyBtvnxo5ks4YOc/lbbo2QwYjAdBgNVHQ4EFgQUDDrq2/m7B8Ej
xrgMsVjAbUN5gm4wHwYDVR0jBBgwFoAUDDrq2/m7B8EjxrgMsVjAbUN5gm4wDwYD
VR0TAQH/BAUwAwEB/zAPBgNVHREECDAGhwR/AAABMAoGCCqGSM49BAMCA0cAMEQC
IFU6wRcZGsurbSkPifCcfVJ7XZ2GIpd0/mNjOHatz7fzAiAbcAkbwcD4dGcs60xF
HdM0GW8w4+xfZAKESsRasHn4GA==
-----END CERTIFICATE-----
"""
KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBKF2gfEo6QjFpJSq
0OvPlJxNXVBRygVuUoRD5TYRs7GhRANCAAQKQrey6ELeKgsOwaygBvLeUK+AC3QZ
wRHmOE0gTNuuhMtHYXjj/h49x32l+hHlaoHY7TyBtvnxo5ks4YOc/lbb
-----END PRIVATE KEY-----
"""


class _Served:
    def __init__(self) -> None:
        self.paths: list[str] = []
        """Every request the server read, in its own record."""


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, _Served, Path]]:
    """An HTTPS server on a loopback port (0): its URL, what it served, its certificate."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text(CERT)
    key.write_text(KEY)
    served = _Served()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", served, cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_https_among_the_urls_keeps_httpx_default_verification() -> None:
    assert verify_for("http://10.0.0.7:8000", "HTTPS://router.example:443") is True
    assert verify_for(None, " https://router.example") is True


def test_plain_http_urls_get_a_context_that_trusts_no_authority() -> None:
    context = verify_for("http://10.0.0.7:8000", None, "http://127.0.0.1:30000")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
    assert isinstance(verify_for(), ssl.SSLContext)


def test_a_plain_http_client_that_meets_tls_fails_closed(
        tls_server: tuple[str, _Served, Path]) -> None:
    url, served, cert = tls_server
    # The control: the server answers a client that trusts its certificate.
    trusting = ssl.create_default_context(cafile=str(cert))
    with httpx.Client(verify=trusting) as client:
        assert client.get(url + "/trusted").text == "ok"
    with httpx.Client(verify=verify_for("http://127.0.0.1:1")) as client, \
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(url + "/unverified")
    assert served.paths == ["/trusted"]  # the handshake failed before any request was sent
