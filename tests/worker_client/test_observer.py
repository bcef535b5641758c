"""The drain observer: what a benchmark learns of each drain, without the client writing
anything itself."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from worker_client import DrainNotice, InvalidSetting, WorkerClient
from worker_client._settings import DRAIN_OBSERVER_ENV

SEEN: list[DrainNotice] = []
"""Where the observer named by the environment puts what it is given."""


def _seen(notice: DrainNotice) -> None:
    SEEN.append(notice)


def test_the_observer_is_given_each_drain_on_the_loop() -> None:
    """1. A client without a coordinator, with an observer, on a running loop.
    2. A local drain (a signal's): the observer is called once, on the loop's thread, as
    ``shutdown_event`` is set, with this process's pid, the source, and the wall-clock times
    the notice was read and acted on (no coordinator: no drain start).
    3. Aborting does not call it again."""
    notices: list[tuple[DrainNotice, str, bool]] = []

    async def engine() -> None:
        client = WorkerClient(None, drain_observer=lambda n: notices.append(
            (n, threading.current_thread().name, client.shutdown_event.is_set())))
        client.start()
        client.start_local_drain("test")
        await asyncio.wait_for(client.shutdown_event.wait(), 5)
        client.close()

    asyncio.run(engine())
    [(notice, thread, was_set)] = notices
    assert (notice.pid, notice.source, notice.started_at) == (os.getpid(), "local", None)
    assert notice.read_in == thread == threading.main_thread().name
    assert was_set
    assert 0 <= notice.set_at - notice.received_at < 5


def test_an_observer_can_be_named_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """1. ``WORKER_CLIENT_DRAIN_OBSERVER=module:callable`` gives the observer to a client
    built without one (a benchmark's engines, which it does not write).
    2. A name that does not import, or is not callable: InvalidSetting when the client is
    built (a ValueError too), not a silent engine without its observer."""
    monkeypatch.setenv(DRAIN_OBSERVER_ENV, f"{__name__}:_seen")
    SEEN.clear()
    client = WorkerClient(None)
    client.start_local_drain("test")  # no loop: acted on in this thread
    assert [n.source for n in SEEN] == ["local"]
    client.close()
    for name in ("no_such_module_here:observe", f"{__name__}:NOTHING", f"{__name__}:SEEN"):
        monkeypatch.setenv(DRAIN_OBSERVER_ENV, name)
        with pytest.raises(InvalidSetting, match=DRAIN_OBSERVER_ENV):
            WorkerClient(None)
    with pytest.raises(ValueError, match="event_reader"):
        WorkerClient(None, event_reader="poll")
