"""``GET /status?view=router``: the compact document routers long-poll."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

from tests.kill.helpers import start_tree
from tests.service.servers import FAST, register, start_coordinator
from tests.service.truth import assert_summary_is_true
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.tcp_queues import tcp_queues

ROUTER_KEYS = {"phase", "generation", "ready", "drain", "workers", "migrations",
               "migration_counts", "stream_ending"}
POLL_S = 3600
"""A long-poll this long (and the coordinator's cap raised to it) cannot end by timing out
while the test runs: an answer within the client's bound means the poll was woken."""


def test_router_view_leaves_out_processes_and_long_polls_like_the_full_one(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Register a tree of 5 processes; the full /status lists them.
    2. /status?view=router has exactly the router's keys (no processes), the same
       generation and workers, and its own ETag; If-None-Match with it answers 304, and
       the full document's ETag does not match it.
    3. A router-view long-poll that nothing wakes ends at its wait unchanged: the same
       generation, still serving.
    4. A router-view long-poll (wait and cap an hour, since=G), once the coordinator has
       read it (the connection's bytes are acknowledged and read, by /proc/net/tcp), is
       woken by POST /drain: it answers (it could not have timed out) with a phase of the
       drain and a higher generation.
    5. An unknown view is a 422.
    6. The drain ends the tree as its summary says (tests/service/truth.py)."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60",
                                "--long-poll-cap", str(POLL_S))
    tree = start_tree(janitor, {"children": [{"children": [{}]}, {"children": [{}]}]},
                      tmp_path / "tree")
    register(running, tree.pid)
    with running.client() as client:
        full = client.get("/status")
        assert len(full.json()["processes"]) == len(tree.pids()) == 5
        router = client.get("/status", params={"view": "router"})
        assert router.status_code == 200
        document = router.json()
        assert set(document) == ROUTER_KEYS
        assert document["generation"] == full.json()["generation"]
        assert document["workers"] == full.json()["workers"]
        assert router.headers["etag"] != full.headers["etag"]
        unchanged = client.get("/status", params={"view": "router"},
                               headers={"If-None-Match": router.headers["etag"]})
        assert unchanged.status_code == 304
        mixed = client.get("/status", params={"view": "router"},
                           headers={"If-None-Match": full.headers["etag"]})
        assert mixed.status_code == 200

        since = document["generation"]
        unwoken = client.get("/status", params={"view": "router", "wait": 0.2, "since": since})
        assert (unwoken.json()["generation"], unwoken.json()["phase"]) == (since, "serving")

        url = urlsplit(running.url)
        host, port = url.hostname, url.port
        assert host is not None
        assert port is not None
        poll = http.client.HTTPConnection(host, port, timeout=60)
        try:
            poll.connect()
            client_port = poll.sock.getsockname()[1]
            poll.request("GET", f"/status?view=router&wait={POLL_S}&since={since}")
            wait_for(lambda: tcp_queues(port, client_port) == (0, 0),
                     what="the coordinator to read the long-poll")
            assert client.post("/drain", json={"wait": False}).status_code == 202
            response = poll.getresponse()
            assert response.status == 200
            answer = json.loads(response.read())
        finally:
            poll.close()
        assert answer["generation"] > since
        assert answer["phase"] in ("draining", "migrating", "terminating", "done")
        assert set(answer) == ROUTER_KEYS
        assert client.get("/status", params={"view": "everything"}).status_code == 422
        done = client.get("/drain").json()
    assert_summary_is_true(done, tree, root_code=tree.root.wait(timeout=30))
