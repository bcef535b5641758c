"""Stopping the coordinator: SIGTERM ends it at once, with nothing left waiting on it."""

from __future__ import annotations

import http.client
import json
import signal
from pathlib import Path
from urllib.parse import urlsplit

from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.tcp_queues import tcp_queues


def test_sigterm_answers_a_waiting_long_poll_and_exits_0(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. a coordinator whose long-poll cap is an hour;
    2. a router's long-poll ``GET /status?wait=3600&since=G`` is sent and read by the
       coordinator (the connection's bytes are acknowledged and read, by /proc/net/tcp);
    3. SIGTERM the coordinator;
    4. the long-poll is answered (200, a newer generation: it could not have timed out)
       instead of being cut off when the server's shutdown bound runs out, and the
       coordinator exits 0."""
    running = start_coordinator(janitor, tmp_path, "--long-poll-cap", "3600")
    since = int(running.status()["generation"])
    url = urlsplit(running.url)
    assert url.hostname is not None
    assert url.port is not None
    poll = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        poll.connect()
        client_port = poll.sock.getsockname()[1]
        poll.request("GET", f"/status?view=router&wait=3600&since={since}")
        wait_for(lambda: tcp_queues(url.port or 0, client_port) == (0, 0),
                 what="the coordinator to read the long-poll")
        running.proc.send_signal(signal.SIGTERM)
        response = poll.getresponse()
        assert response.status == 200
        answer = json.loads(response.read())
    finally:
        poll.close()
    assert answer["generation"] > since
    assert running.proc.wait(timeout=60) == 0
