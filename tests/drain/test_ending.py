"""The step that ends a stock engine's streams for the proxy (``coordinator.drain.ending``):
its table, its counts and its window, without a clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coordinator.drain.ending import (
    ACK_WINDOW_S,
    FINAL,
    TRANSITIONS,
    EndingState,
    IllegalEnding,
    StreamEnding,
)
from coordinator.engines import PROFILES
from coordinator.settings import Settings

T0 = 1_000.0
MIGRATION_DEADLINE = T0 + 60


def ended(count: int) -> StreamEnding:
    ending = StreamEnding()
    assert ending.routers_out(count, T0)
    ending.answered(True, "POST /abort_request answered 200", T0 + 0.01, MIGRATION_DEADLINE)
    return ending


def test_every_state_is_in_the_table_and_the_final_ones_lead_nowhere() -> None:
    assert set(TRANSITIONS) == set(EndingState)
    for state in FINAL:
        assert TRANSITIONS[state] == {}
    for moves in TRANSITIONS.values():
        assert set(moves) <= set(EndingState)


def test_the_streams_the_proxy_took_over_are_continued_the_rest_cut() -> None:
    ending = ended(3)
    assert ending.open
    assert ending.state not in FINAL  # not "settled": mypy would keep it False below
    assert ending.acknowledge(["r1.0", "r2.0"], T0 + 1) == (["r1.0", "r2.0"], [])
    assert ending.open
    assert ending.cut == 1
    ending.tick(T0 + 0.01 + ACK_WINDOW_S)  # the window is over: the third one was cut
    assert ending.state is EndingState.CLOSED
    assert ending.settled
    assert (ending.ended, len(ending.continued), ending.cut) == (3, 2, 1)
    assert ending.acknowledge(["r3.0"], T0 + 20) == ([], ["r3.0"])  # too late
    assert ending.cut == 1


def test_the_window_closes_as_soon_as_every_ended_stream_is_acknowledged() -> None:
    ending = ended(2)
    ending.acknowledge(["a.0"], T0 + 1)
    ending.acknowledge(["b.0"], T0 + 1.5)
    assert ending.state is EndingState.CLOSED
    assert ending.closed_at == T0 + 1.5
    assert ending.cut == 0


def test_an_id_counts_once_and_never_more_than_were_ended() -> None:
    ending = ended(2)
    assert ending.acknowledge(["a.0", "a.0"], T0 + 1) == (["a.0"], [])
    assert ending.acknowledge(["a.0"], T0 + 1) == ([], ["a.0"])
    assert ending.acknowledge(["b.0", "c.0"], T0 + 1) == (["b.0"], ["c.0"])
    assert len(ending.continued) == 2
    assert ending.cut == 0


def test_the_window_never_outlives_the_migration_deadline() -> None:
    ending = StreamEnding()
    ending.routers_out(1, T0)
    ending.answered(True, "ok", T0, T0 + 2)
    assert ending.window_until == T0 + 2


def test_nothing_is_ended_when_nothing_is_in_flight_or_the_count_is_unknown() -> None:
    for count in (0, None):
        ending = StreamEnding()
        assert not ending.routers_out(count, T0)
        assert ending.state is EndingState.SKIPPED
        assert ending.settled
        assert (ending.ended, ending.cut) == (0, 0)


def test_a_router_that_kept_the_pod_means_nothing_is_ended() -> None:
    ending = StreamEnding()
    ending.router_kept("vllm-router: answered 500")
    assert ending.state is EndingState.SKIPPED
    assert ending.note == "vllm-router: answered 500"
    assert ending.acknowledge(["a.0"], T0) == ([], ["a.0"])


def test_an_engine_that_refused_the_call_ended_nothing() -> None:
    ending = StreamEnding()
    ending.routers_out(4, T0)
    ending.answered(False, "POST /abort_requests answered 404", T0 + 1, MIGRATION_DEADLINE)
    assert ending.state is EndingState.FAILED
    assert ending.settled
    assert (ending.ended, ending.cut) == (0, 0)


def test_moves_outside_the_table_are_refused() -> None:
    ending = ended(1)
    with pytest.raises(IllegalEnding):
        ending.router_kept("too late")
    with pytest.raises(IllegalEnding):
        StreamEnding().answered(True, "never called", T0, MIGRATION_DEADLINE)


def test_the_record_round_trips() -> None:
    ending = ended(2)
    ending.acknowledge(["a.0"], T0 + 1)
    again = StreamEnding.from_record(ending.to_record())
    assert again == ending
    assert again.to_status()["continued"] == 1


def test_the_setting_is_off_by_default_and_needs_a_profile_that_knows_the_call() -> None:
    assert Settings().end_streams is False
    assert PROFILES["sglang"].ender is not None
    assert PROFILES["vllm"].ender is not None
    on = Settings(engine="sglang", end_streams=True)
    assert on.engine_url == "http://127.0.0.1:30000"
    for engine in ("generic", "dynamo", "tgi", "trtllm"):
        with pytest.raises(ValidationError, match="knows no call"):
            Settings(engine=engine, end_streams=True)
