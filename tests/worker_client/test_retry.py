"""The retry policies, as pure functions of made-up retry states: nothing sleeps."""

from __future__ import annotations

import pytest
from tenacity import RetryCallState, Retrying

from worker_client import _retry
from worker_client.errors import (
    ClientClosed,
    CoordinatorRefused,
    CoordinatorUnreachable,
    NotRegistered,
    ProtocolError,
    StreamEnded,
    WorkerUnknown,
)


def _state(attempt: int, error: BaseException | None = None) -> RetryCallState:
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    if error is not None:
        state.set_exception((type(error), error, None))
    return state


def test_reconnect_pauses_double_from_20_ms_up_to_2_s_with_half_jitter() -> None:
    """1. Without jitter (a draw of 0.5): 20, 40, 80 ms ... capped at 2 s.
    2. The draw scales each pause by 0.5 to 1.5."""
    assert [_retry.reconnect_pause(n, 0.5) for n in (1, 2, 3, 8, 20)] == \
        [0.02, 0.04, 0.08, 2.0, 2.0]
    assert _retry.reconnect_pause(1, 0.0) == pytest.approx(0.01)
    assert _retry.reconnect_pause(8, 0.999) == pytest.approx(2.998)


def test_reconnect_counts_failures_since_the_last_healthy_stream() -> None:
    """1. Attempts 1-3 fail: 20, 40, 80 ms.
    2. Attempt 4 says hello (healthy), then ends: 20 ms again; attempt 5 fails: 40 ms.
    3. Attempt 6 answers 404 (the worker is unknown): register again at once, uncounted;
    attempt 7 fails: 80 ms."""
    wait = _retry.wait_reconnect(draw=lambda: 0.5)
    ended = StreamEnded("x")
    assert [wait(_state(n, ended)) for n in (1, 2, 3)] == [0.02, 0.04, 0.08]
    wait.healthy(4)
    assert wait(_state(4, ended)) == 0.02
    assert wait(_state(5, ended)) == 0.04
    assert wait(_state(6, WorkerUnknown())) == 0.0
    assert wait(_state(7, ended)) == 0.08


def test_report_pauses_double_from_50_ms_up_to_1_s_without_jitter() -> None:
    wait = _retry.report_wait()
    assert [wait(_state(n)) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_registration_pauses_start_short_and_stay_under_2_s() -> None:
    """Doubling from 50 ms, plus up to 50 ms of jitter (a draw of 0.5: 25 ms), capped."""
    wait = _retry.registration_wait(draw=lambda: 0.5)
    refused = CoordinatorRefused(503, "x")
    assert [wait(_state(n, refused)) for n in range(1, 8)] == pytest.approx(
        [0.075, 0.125, 0.225, 0.425, 0.825, 1.625, 2.0])
    assert wait(_state(200, refused)) == 2.0
    jittered = _retry.registration_wait()
    assert 0.05 <= jittered(_state(1)) <= 0.1
    assert all(jittered(_state(n)) <= 2.0 for n in range(1, 40))


def test_registration_asks_again_within_100_ms_while_nothing_listens() -> None:
    """A refused connection (the coordinator still starting): the pauses grow from 50 ms and
    stay at 0.1 s however many attempts failed; an unreachable coordinator for another
    reason (a timeout) backs off to 2 s."""
    wait = _retry.registration_wait(draw=lambda: 0.5)
    refused = CoordinatorUnreachable("POST /workers: refused")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    pauses = [wait(_state(n, refused)) for n in range(1, 40)]
    assert pauses[:3] == pytest.approx([0.075, 0.1, 0.1])
    assert max(pauses) == _retry.REGISTER_NOT_LISTENING_MAX_S == 0.1
    timed_out = CoordinatorUnreachable("POST /workers: timed out")
    timed_out.__cause__ = TimeoutError("timed out")
    assert wait(_state(30, timed_out)) == _retry.REGISTER_MAX_S


@pytest.mark.parametrize(("error", "registration", "report", "stream"), [
    (CoordinatorUnreachable("refused"), True, True, True),
    (ProtocolError("garbage"), True, True, True),
    (CoordinatorRefused(503, "x"), True, True, True),
    (CoordinatorRefused(429, "x"), True, True, True),
    (CoordinatorRefused(408, "x"), True, True, True),
    (WorkerUnknown(), False, True, True),
    (CoordinatorRefused(422, "x"), False, False, True),
    (CoordinatorRefused(401, "x"), False, False, False),
    (CoordinatorRefused(403, "x"), False, False, False),
    (NotRegistered("x"), False, True, True),
    (ClientClosed("x"), False, True, False),
])
def test_what_each_caller_retries(error: BaseException, registration: bool, report: bool,
                                  stream: bool) -> None:
    """1. Registration: no answer, garbage, 5xx, 408, 429. 2. Reports: anything but a
    refusal no attempt can fix (422, 401...). 3. The stream: anything but the token refused
    or the client closed."""
    assert _retry.registration_retryable(error) is registration
    assert _retry.report_retryable(error) is report
    assert _retry.stream_retryable(error) is stream
