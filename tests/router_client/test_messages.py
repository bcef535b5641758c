"""router_client.messages: the coordinator's answers as typed objects, parsed in one place
(pure: no sockets, no processes)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

import shutdown_wire as wire
from router_client import (
    AckResult,
    DrainInfo,
    HandedBack,
    MalformedAnswer,
    Migration,
    MigrationCounts,
    RouterClientError,
    RouterStatus,
    Watcher,
    WorkerEntry,
)


def worker(url: str | None = "http://w1", state: str = wire.WORKER_SERVING,
           **fields: Any) -> dict[str, Any]:
    """A ``workers[]`` entry as the coordinator writes it (every field it serves)."""
    return {"id": "w-1", "pid": 4242, "role": "worker", "name": "python", "url": url,
            "state": state, "inflight": 2, "handed_back": 0, "connected": True,
            "awaiting_report": False, "notified_at": None, "pushed_at": None,
            "prekill_done": False, "registered_at": 1767000000.5, "exited_at": None,
            "exit_code": None, **fields}


def router_view(phase: str = wire.PHASE_SERVING, workers: list[dict[str, Any]] | None = None,
                **fields: Any) -> dict[str, Any]:
    """A ``/status?view=router`` document as the coordinator writes it."""
    return {
        "phase": phase, "generation": 7, "ready": phase == wire.PHASE_SERVING,
        "drain": None if phase == wire.PHASE_SERVING else {
            "reason": "preStop", "started_at": 1767000100.0, "deadline_at": 1767000125.0,
            "migration_deadline_at": 1767000113.0, "min_drain_until": None, "budget_s": 25.0,
            "migration_s": 13.0, "termination_s": 12.0, "outcome": None, "causes": [],
            "lost_requests": 0, "errors": [], "ended_at": None, "force": False},
        "workers": [worker()] if workers is None else workers,
        "migrations": [{"request_id": "r1", "worker": "w-1", "worker_url": "http://w1",
                        "tokens": 12, "handed_back_at": 1767000101.25, "detail": None}],
        "migration_counts": {"handed_back": 1, "acked": 0, "expired": 0, "pending": 1,
                             "early_acks": 0},
        **fields,
    }


def test_a_router_view_parses_into_typed_objects() -> None:
    """1. A draining coordinator's router view parses into a RouterStatus.
    2. Its drain, workers, migrations and counts are typed objects with the served values;
       an integer where a number is expected reads as a float."""
    status = RouterStatus.from_json(router_view(wire.PHASE_MIGRATING))
    assert status == RouterStatus(
        phase=wire.PHASE_MIGRATING, generation=7, ready=False,
        drain=DrainInfo(reason="preStop", started_at=1767000100.0, deadline_at=1767000125.0,
                        migration_deadline_at=1767000113.0, outcome=None),
        workers=(WorkerEntry(id="w-1", pid=4242, role="worker", url="http://w1",
                             state=wire.WORKER_SERVING, inflight=2, handed_back=0,
                             connected=True, awaiting_report=False,
                             registered_at=1767000000.5, exited_at=None),),
        migrations=(Migration(request_id="r1", worker="w-1", worker_url="http://w1", tokens=12,
                              handed_back_at=1767000101.25),),
        migration_counts=MigrationCounts(handed_back=1, acked=0, expired=0, pending=1,
                                         early_acks=0),
    )
    assert status.draining
    assert status.migration("r1") is status.migrations[0]
    assert status.migration("r2") is None
    assert isinstance(status.drain, DrainInfo)
    assert isinstance(status.drain.started_at, float)


def test_fields_it_does_not_know_are_ignored() -> None:
    """1. A document from a newer coordinator: extra fields at the top, in the drain, in a
       worker, in a migration and in the counts (the full /status is such a document).
    2. It parses to what the same document without them parses to."""
    plain = router_view(wire.PHASE_DRAINING)
    richer = copy.deepcopy(plain)
    richer.update(processes=[{"pid": 1}], timeline=[], future={"x": 1})
    richer["drain"]["future"] = 1
    richer["workers"][0]["future"] = [1]
    richer["migrations"][0]["future"] = "x"
    richer["migration_counts"]["future"] = 3
    assert RouterStatus.from_json(richer) == RouterStatus.from_json(plain)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("phase"), "/status: missing field 'phase'"),
        (lambda d: d.update(generation=True), "/status: field 'generation' should be an "
                                              "integer, got bool True"),
        (lambda d: d.update(generation="7"), "field 'generation' should be an integer, got "
                                             "str '7'"),
        (lambda d: d["workers"][0].pop("state"), "/status workers[0]: missing field 'state'"),
        (lambda d: d["workers"][0].update(url=5), "/status workers[0]: field 'url' should be "
                                                  "a string, got int 5"),
        (lambda d: d["migrations"][0].update(tokens=None),
         "/status migrations[0]: field 'tokens' should be an integer, got null"),
        (lambda d: d["migrations"][0].update(detail=[1]),
         "field 'detail' should be a string or an object, got list [1]"),
        (lambda d: d["drain"].pop("deadline_at"), "/status drain: missing field 'deadline_at'"),
        (lambda d: d.update(workers={}), "field 'workers' should be a list, got dict {}"),
        (lambda d: d["workers"].append("w-2"),
         "/status workers[1]: expected a JSON object, got str 'w-2'"),
        (lambda d: d.pop("migration_counts"), "missing field 'migration_counts'"),
    ],
)
def test_a_missing_or_mistyped_field_is_a_clear_error(change: Any, message: str) -> None:
    """1. A router view with one field missing or of the wrong type.
    2. Parsing it raises MalformedAnswer (a RouterClientError and a ValueError) whose
       message names the document, the path to the field and what was wrong."""
    document = router_view(wire.PHASE_DRAINING)
    change(document)
    with pytest.raises(MalformedAnswer) as raised:
        RouterStatus.from_json(document)
    assert message in str(raised.value)
    assert isinstance(raised.value, RouterClientError)
    assert isinstance(raised.value, ValueError)


def test_a_status_that_is_no_object_is_a_clear_error() -> None:
    with pytest.raises(MalformedAnswer, match=r"^/status: expected a JSON object, got list"):
        RouterStatus.from_json([1, 2])


def test_ack_answers_parse_and_say_what_was_taken() -> None:
    """1. An ack answer parses into an AckResult; ``taken`` is ``acked`` then ``early``.
    2. An id that is not a string, or a missing list, is a MalformedAnswer."""
    answer = AckResult.from_json({"acked": ["r1"], "early": ["r2"], "unknown": ["r3"],
                                  "future": 1})
    assert answer == AckResult(acked=("r1",), early=("r2",), unknown=("r3",))
    assert answer.taken == ("r1", "r2")
    with pytest.raises(MalformedAnswer, match=r"/migrations/ack: early\[1\] should be a string"):
        AckResult.from_json({"acked": [], "early": ["r2", 3], "unknown": []})
    with pytest.raises(MalformedAnswer, match="missing field 'unknown'"):
        AckResult.from_json({"acked": [], "early": []})


def test_the_handed_back_event_an_engine_writes_is_read_back() -> None:
    """1. ``shutdown_wire.handed_back_event`` (what worker_client writes) reads back as a
       HandedBack with the same request id and token count.
    2. An ordinary completion chunk (or ``handed_back: false``) is not one: None.
    3. A handed-back event without its token count is a MalformedAnswer."""
    assert HandedBack.from_event(wire.handed_back_event("client-7.0", 12)) == HandedBack(
        request_id="client-7.0", tokens=12)
    assert HandedBack.from_event({"choices": [{"text": "a"}]}) is None
    assert HandedBack.from_event({"handed_back": False, "request_id": "r"}) is None
    assert HandedBack.from_event("[DONE]") is None
    with pytest.raises(MalformedAnswer, match="handed-back event: missing field 'tokens'"):
        HandedBack.from_event({"handed_back": True, "request_id": "r"})


@pytest.mark.parametrize(
    ("phase", "states", "draining"),
    [
        (wire.PHASE_SERVING, [wire.WORKER_SERVING], False),
        (wire.PHASE_SERVING, [wire.WORKER_DRAINING], True),
        (wire.PHASE_SERVING, [wire.WORKER_DRAINED], True),
        (wire.PHASE_SERVING, [wire.WORKER_TERMINATING], True),
        (wire.PHASE_SERVING, [wire.WORKER_EXITED], True),
        (wire.PHASE_SERVING, [wire.WORKER_EXITED, wire.WORKER_SERVING], False),
        (wire.PHASE_SERVING, [], False),
        *[(phase, [wire.WORKER_SERVING], True) for phase in sorted(wire.DRAIN_PHASES)],
    ],
)
async def test_is_draining_judges_worker_states_by_worker_states(
    phase: str, states: list[str], draining: bool
) -> None:
    """1. A Watcher whose view of the coordinator is a router view in ``phase`` listing the
       worker at http://w1/ once per state in ``states`` (none: the coordinator does not
       list it, as with an adopted engine).
    2. ``is_draining`` is true in every phase but ``serving``; while serving, when the
       worker is listed and none of its entries is ``serving``."""
    document = router_view(phase, [worker("http://w1/", s, id=f"w-{i}")
                                   for i, s in enumerate(states)])
    async with httpx.AsyncClient() as http:
        watcher = Watcher({"http://w1": "http://c1"}, http=http)
        watcher.views["http://c1"].status = RouterStatus.from_json(document)
        assert watcher.is_draining("http://w1") is draining
        assert watcher.is_draining("http://elsewhere") is False


async def test_a_watcher_answers_with_typed_migrations() -> None:
    """1. A Watcher over two coordinators, each listing one pending migration.
    2. ``handed_back`` finds each by request id as a Migration (None for an unknown id);
       ``pending_migrations`` lists both; a coordinator not heard from yet has none."""
    first, second = router_view(wire.PHASE_MIGRATING), router_view(wire.PHASE_MIGRATING)
    second["migrations"][0].update(request_id="r2", worker_url="http://w2")
    async with httpx.AsyncClient() as http:
        watcher = Watcher({"http://w1": "http://c1", "http://w2": "http://c2",
                           "http://w3": "http://c3"}, http=http)
        watcher.views["http://c1"].status = RouterStatus.from_json(first)
        watcher.views["http://c2"].status = RouterStatus.from_json(second)
        found = watcher.handed_back("r2")
        assert isinstance(found, Migration)
        assert (found.worker_url, found.tokens) == ("http://w2", 12)
        assert watcher.handed_back("r9") is None
        assert [m.request_id for m in watcher.pending_migrations()] == ["r1", "r2"]
        assert watcher.views["http://c3"].migrations() == ()
        assert watcher.views["http://c3"].phase is None


def test_public_surface() -> None:
    """1. Every name in ``router_client.__all__`` exists."""
    import router_client

    for name in router_client.__all__:
        assert hasattr(router_client, name), name
