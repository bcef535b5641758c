"""Every retry policy of the client, as tenacity policies: small callables, no sleeping.

They are pure functions of the retry state (and of a random draw where there is jitter), so
tests call them with made-up states instead of waiting (tests/worker_client/test_retry.py).
Which errors each caller retries is decided here too.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tenacity import RetryCallState, wait_exponential
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from worker_client.errors import (
    ClientClosed,
    CoordinatorError,
    CoordinatorRefused,
    WorkerUnknown,
)

REGISTER_FIRST_S = 0.05
"""First pause between registration attempts (s). Short: the coordinator usually starts next
to the engine and is up within a fraction of a second."""
REGISTER_MAX_S = 2.0
"""Longest pause between attempts (s): how late the engine may register after a coordinator
that answered with an error (a 5xx, a limit reached, a timeout) can take it."""
REGISTER_NOT_LISTENING_MAX_S = 0.1
"""Longest pause while nothing listens at the coordinator's address (s): the sidecar is
still starting beside the engine (or restarting). A refused connection on the pod's own
network costs microseconds, so the engine registers within 0.1 s of the coordinator
listening, however late that is; a pod is Ready only once its engine registered."""

RECONNECT_FIRST_S = 0.02
"""First pause before the event stream is opened again (s), jittered by ±50 %: the doorbell
and the stream are how a drain reaches the engine, so a lost stream is reopened at once."""
RECONNECT_MAX_S = 2.0
"""Longest pause between stream attempts (s), against a coordinator that stays away."""

REPORT_FIRST_S = 0.05
"""First pause after a failed report (s); doubles up to REPORT_MAX_S, no jitter: there is
one reporter per engine and the coordinator is local."""
REPORT_MAX_S = 1.0

RETRIED_STATUSES = frozenset({408, 429})
"""4xx answers to a registration that a later attempt can fix: the body was too slow, or a
limit of the coordinator's was reached."""
RETRIED_REPORT_STATUSES = frozenset({404, 408, 429})
"""Refusals of a report a later attempt can fix: an unknown worker (the client registers
again), a body too slow, a limit reached. Any other 4xx (an invalid report, a bad token)
would be refused forever: such a report is dropped and logged."""
FINAL_STREAM_STATUSES = frozenset({401, 403})
"""Answers to the event stream that end the client's attempts: the token is wrong."""


class stop_when_true(stop_base):
    """Stop retrying once ``predicate()`` is true (the client was closed)."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self.predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.predicate()


def no_pause(seconds: float) -> None:
    """tenacity's sleep for a retry that does not wait (a stale kept-alive connection).

    tenacity sleeps even for 0 s, and ``time.sleep(0)`` gives up the GIL: a report thread
    of a busy engine may then wait up to the 5 ms switch interval to get it back."""


class registration_wait(wait_base):
    """Pauses from ``REGISTER_FIRST_S``, doubling, plus up to ``REGISTER_FIRST_S`` of jitter:
    at most ``REGISTER_NOT_LISTENING_MAX_S`` after a refused connection, ``REGISTER_MAX_S``
    after anything else (tenacity's ``wait_exponential_jitter``, with the cap by cause)."""

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self.draw = draw

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        refused = error is not None and isinstance(error.__cause__, ConnectionRefusedError)
        cap = REGISTER_NOT_LISTENING_MAX_S if refused else REGISTER_MAX_S
        exponent = min(retry_state.attempt_number - 1, 64)  # 2 ** 64 s: capped long before
        pause: float = REGISTER_FIRST_S * 2.0 ** exponent + REGISTER_FIRST_S * self.draw()
        return min(pause, cap)


def registration_retryable(exc: BaseException) -> bool:
    """No answer, an unreadable one, a 5xx, 408 or 429: a later attempt may succeed."""
    if isinstance(exc, CoordinatorRefused):
        return exc.status >= 500 or exc.status in RETRIED_STATUSES
    return isinstance(exc, CoordinatorError)


def report_wait() -> wait_base:
    return wait_exponential(multiplier=REPORT_FIRST_S, max=REPORT_MAX_S)


def report_retryable(exc: BaseException) -> bool:
    """Anything but a refusal no later attempt can fix (the report is then dropped)."""
    if isinstance(exc, CoordinatorRefused):
        return exc.status >= 500 or exc.status in RETRIED_REPORT_STATUSES
    return isinstance(exc, Exception)


def stream_retryable(exc: BaseException) -> bool:
    """Open the stream again after anything but the client's close or a bad token."""
    if isinstance(exc, CoordinatorRefused):
        return exc.status not in FINAL_STREAM_STATUSES
    return isinstance(exc, Exception) and not isinstance(exc, ClientClosed)


def reconnect_pause(failures: int, draw: float) -> float:
    """The pause after the ``failures``-th failure in a row (s); ``draw`` is in [0, 1)."""
    return float(min(RECONNECT_MAX_S, RECONNECT_FIRST_S * 2 ** (failures - 1)) * (0.5 + draw))


class wait_reconnect(wait_base):
    """``reconnect_pause``, the failures counted since the stream was last healthy.

    A stream that said hello was healthy: when it ends, the next pause is the first again
    (``healthy(attempt_number)``, from inside that attempt). A WorkerUnknown (the coordinator
    restarted without its state) is answered by registering again at once, and is not
    counted as a failure."""

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self._draw = draw
        self._before = 0
        """Attempts that do not count: up to the last healthy one, and every WorkerUnknown."""

    def healthy(self, attempt_number: int) -> None:
        self._before = attempt_number - 1

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        if outcome is not None and isinstance(outcome.exception(), WorkerUnknown):
            self._before += 1
            return 0.0
        return reconnect_pause(retry_state.attempt_number - self._before, self._draw())
