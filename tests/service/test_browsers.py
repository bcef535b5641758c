"""A web page cannot drain the pod: requests shaped like a browser's (cross-site, a form's
body, a DNS name rebound to the coordinator's address) are refused on every path, in a real
Chromium too, while the kubelet's own requests (no ``Origin``, no ``Sec-Fetch-Site``, the
pod's address as ``Host``) keep working.

Ground truth: the engine's process still runs (``/proc``) after every refused request, and
is gone after the kubelet's drain.
"""

from __future__ import annotations

import http.server
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.service.servers import FAST, Running, register, start_coordinator
from tests.support.neighbour import alive
from tests.support.processes import ProcessJanitor, wait_for
from tests.timeline.browser import Browser, chromium

EVIL = "https://evil.example"
KUBELET = {"User-Agent": "kube-probe/1.31", "Accept": "*/*", "Connection": "close"}
"""What the kubelet's httpGet sends besides ``Host`` (Go's client adds no Origin)."""


def _engine(janitor: ProcessJanitor, running: Running) -> int:
    pid = janitor.spawn(["sleep", "600"], cwd="/", service=True,
                        exit_code=-signal.SIGTERM).pid
    register(running, pid)
    return pid


def _serving(running: Running) -> bool:
    return bool(running.status()["phase"] == "serving")


def test_browser_shaped_requests_are_refused_and_the_kubelets_are_served(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator without a token (loopback) and a registered engine;
    2. ``GET /drain`` with a cross-site ``Origin`` and ``Sec-Fetch-Site`` (what ``<img>``
       sends), with either alone, and with ``same-site``: 403;
    3. an empty urlencoded ``POST /drain`` (a form), with ``Origin`` 403, without (an old
       browser) 415; a ``text/plain`` one 415;
    4. any path, probes included, with ``Host: evil.example`` (DNS rebinding): 421;
    5. after all of them the pod serves and the engine runs (per /proc);
    6. a name given by ``--allowed-host`` and the same-origin ``Origin`` are served;
    7. the kubelet's probes and its ``GET /drain`` (Host: the pod's address, no Origin):
       served, and the drain ends the engine (per /proc)."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--allowed-host",
                                "coordinator.example")
    engine = _engine(janitor, running)
    port = urlsplit(running.url).port
    with httpx.Client(base_url=running.url, timeout=60) as client:
        # 2.
        for headers in ({"Origin": EVIL, "Sec-Fetch-Site": "cross-site"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Origin": EVIL},
                        {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):
            answer = client.get("/drain", headers=headers)
            assert answer.status_code == 403, (headers, answer.text)
            assert "refused" in answer.json()["detail"]
        # 3.
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert client.post("/drain", headers={**form, "Origin": EVIL}).status_code == 403
        refused = client.post("/drain", headers=form, content=b"")
        assert refused.status_code == 415, refused.text
        assert "application/json" in refused.json()["detail"]
        assert client.post("/drain", headers={"Content-Type": "text/plain"},
                           content=b"{}").status_code == 415
        # 4.
        for path in ("/drain", "/status", "/healthz", "/readyz", "/metrics"):
            answer = client.get(path, headers={"Host": f"evil.example:{port}"})
            assert answer.status_code == 421, (path, answer.text)
            assert "--allowed-host" in answer.json()["detail"]
        # 5.
        assert _serving(running)
        assert alive(engine)
        # 6.
        assert client.get("/status", headers={"Host": f"coordinator.example:{port}"}
                          ).status_code == 200
        assert client.get("/status", headers={"Origin": running.url}).status_code == 200
        assert client.get("/status", headers={"Sec-Fetch-Site": "same-origin"}
                          ).status_code == 200
        # 7.
        pod = {**KUBELET, "Host": f"127.0.0.1:{port}"}
        assert client.get("/healthz", headers=pod).status_code == 200
        assert client.get("/readyz", headers=pod).status_code == 200
        drained = client.get("/drain", headers=pod)
    assert drained.status_code == 200, drained.text
    assert drained.json()["phase"] == "done"
    wait_for(lambda: not alive(engine) or None, what="the engine ended by the drain")


EVIL_PAGE = """<!doctype html><html><body>
<img src="{coordinator}/drain">
<iframe name="sink"></iframe>
<form id="form" method="POST" action="{coordinator}/drain" target="sink"></form>
<script>
  fetch("{coordinator}/drain", {{method: "POST", mode: "no-cors", body: "{{}}",
                                  headers: {{"Content-Type": "text/plain"}}}});
  fetch("{coordinator}/drain", {{mode: "no-cors"}});
  document.getElementById("form").submit();
</script></body></html>"""


@contextmanager
def _site(page: str) -> Iterator[int]:
    """Serve ``page`` at ``/`` on a loopback port (its number) until the block ends."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.skipif(chromium() is None,
                    reason="chromium is not installed (scripts/test.sh installs it)")
def test_a_page_in_a_real_browser_cannot_drain_the_pod(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator without a token and a registered engine; a page of
       ``http://evil.example`` (resolved to loopback by Chromium's rules) that loads
       ``/drain`` as an image, fetches it (GET, and a POST of ``text/plain``) and posts an
       empty form to it; 2. Chromium sends all four, and each is answered 403;
    3. a page at ``http://evil.example:<coordinator's port>/status`` (the coordinator's
       address under a rebound name) is answered 421; 4. the pod still serves and the
       engine runs (per /proc)."""
    running = start_coordinator(janitor, tmp_path, *FAST)
    engine = _engine(janitor, running)
    port = urlsplit(running.url).port
    coordinator = running.url
    with _site(EVIL_PAGE.format(coordinator=coordinator)) as site_port:
        browser = Browser(janitor, tmp_path / "profile",
                          flags=("--host-resolver-rules=MAP evil.example 127.0.0.1",))
        try:
            page = browser.open(f"http://evil.example:{site_port}/")
            # 2.
            settled = _settled(browser, page.session, coordinator + "/drain", count=4)
            # An image's JSON answer is blocked by the browser (ORB) after it arrived.
            assert sorted(map(str, settled)) == ["403", "403", "403", "net::ERR_BLOCKED_BY_ORB"]
            # 3.
            rebound = browser.open(f"http://evil.example:{port}/status")
            assert _settled(browser, rebound.session, f"http://evil.example:{port}/",
                            count=1) == [421]
        finally:
            browser.close()
    # 4.
    assert _serving(running)
    assert alive(engine)


def _settled(browser: Browser, session: str, prefix: str, count: int) -> list[int | str]:
    """How the first ``count`` requests of the page ``session`` to URLs starting with
    ``prefix`` ended, waiting for them: the answer's status, or the browser's error where
    no answer reached the page."""
    while True:
        sent: list[str] = []
        ended: dict[str, int | str] = {}
        for event in browser.events:
            if event.get("sessionId") != session:
                continue
            params = event.get("params", {})
            method = event.get("method")
            if method == "Network.requestWillBeSent" and \
                    params["request"]["url"].startswith(prefix):
                sent.append(params["requestId"])
            elif method == "Network.responseReceived":
                ended[params["requestId"]] = int(params["response"]["status"])
            elif method == "Network.loadingFailed":
                ended.setdefault(params["requestId"], str(params["errorText"]))
        done = [ended[r] for r in sent if r in ended]
        if len(done) >= count:
            return done[:count]
        browser.read_event()
