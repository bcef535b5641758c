"""Where the drain notice is read: on the engine's asyncio loop, or in a reader thread."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

CHILD = Path(__file__).with_name("reader_child.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("reader", "read_in", "sources"), [
    ("loop", "MainThread", ("doorbell", "push")),
    ("thread", "worker-client-events", ("push",)),
])
def test_the_drain_notice_sets_shutdown_event_from_either_reader(
    janitor: ProcessJanitor, tmp_path: Path, reader: str, read_in: str, sources: tuple[str, ...]
) -> None:
    """1. Start a coordinator and an asyncio engine whose worker client reads its event
       stream with the given reader (``loop``: add_reader on the engine's loop; ``thread``).
    2. Once its stream is open, POST /drain wait=false.
    3. The engine's shutdown_event is set on its loop's thread either way; the notice was
       read by the loop's own thread (loop reader: the doorbell or the stream's line,
       whichever the loop saw first) or by the reader thread (the line: it does not watch
       the doorbell).
    4. The drain goes on (the engine reported 0 in flight) and ends done; its kill's SIGTERM
       ends the engine."""
    coordinator = start_coordinator(janitor, tmp_path, *FAST)
    child = janitor.spawn([sys.executable, str(CHILD), coordinator.url, reader], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline() == b"registered\n"
    wait_for(lambda: any(w["connected"] for w in coordinator.status()["workers"]),
             what="event stream open")
    with coordinator.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
        line = child.stdout.readline().decode()
        head, _, source = line.strip().rpartition(" source=")
        assert head == f"drain read-in={read_in} set-on-loop=True", line
        assert source in sources, line
        assert client.get("/drain").json()["phase"] == "done"
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_an_unknown_reader_is_refused() -> None:
    """1. Ask for an event reader that does not exist: ValueError at construction."""
    from worker_client import WorkerClient

    with pytest.raises(ValueError, match="event_reader"):
        WorkerClient(None, event_reader="poll")
