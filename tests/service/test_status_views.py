"""``GET /status?view=router``: the compact document routers long-poll."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.service.servers import FAST, register, start_coordinator
from tests.service.trees import start_tree
from tests.support.processes import ProcessJanitor

ROUTER_KEYS = {"phase", "generation", "ready", "drain", "workers", "migrations",
               "migration_counts"}


def test_router_view_leaves_out_processes_and_long_polls_like_the_full_one(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Register a tree of 5 processes; the full /status lists them.
    2. /status?view=router has exactly the router's keys (no processes), the same
       generation and workers, and its own ETag; If-None-Match with it answers 304, and
       the full document's ETag does not match it.
    3. A router-view long-poll (wait=20, since=G) is woken by POST /drain and answers the
       draining phase with a higher generation.
    4. An unknown view is a 422."""
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60")
    tree = start_tree(janitor, tmp_path, children=2, grandchildren=1)
    register(running, tree["pid"])
    with running.client() as client:
        full = client.get("/status")
        assert len(full.json()["processes"]) == len(tree["all"])
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
        answer: dict[str, Any] = {}

        def poll() -> None:
            with running.client() as poller:
                answer.update(poller.get("/status", params={
                    "view": "router", "wait": 20, "since": since}).json())

        poller = threading.Thread(target=poll)
        poller.start()
        assert client.post("/drain", json={"wait": False}).status_code == 202
        poller.join(timeout=60)
        assert answer["generation"] > since
        assert answer["phase"] != "serving"
        assert "processes" not in answer
        assert client.get("/status", params={"view": "everything"}).status_code == 422
