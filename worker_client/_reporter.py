"""Send the worker's reports to the coordinator in batches, from a thread of its own.

Handed-back requests and in-flight counts are collected for a short coalescing window and sent
as one ``POST /workers/{id}/report``: a drain interrupts every request of a worker within one
loop iteration, so a window of a few milliseconds turns a burst of handoffs into one call.
Nothing is sent per token. ``prekill_done`` is sent at once. A report that failed is put
back and retried (``_retry``: doubling pauses, cut short by anything new to report).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tenacity import Retrying, retry_if_exception

from worker_client._retry import report_retryable, report_wait

log = logging.getLogger("worker_client")

DEFAULT_WINDOW_S = 0.005
"""Coalescing window (s): long enough to gather one drain's burst of handoffs (they all end
within one or two loop iterations), short against the 50 ms handoff-visibility goal."""

MAX_HANDOFFS_PER_REPORT = 1_000
"""Handoffs in one report at most; more go out in the reports right after it."""
MAX_REPORT_CHARS = 256_000
"""Characters of request ids and details in one report at most (the first handoff always
fits): even if every one were escaped in the JSON (6 bytes each), the body stays under the
smallest limit a coordinator may be given (2 MiB)."""

Report = dict[str, Any]


class Reporter:
    """Collects reports and posts them; ``post`` raises on failure and the batch is kept."""

    def __init__(self, post: Callable[[Report], None], window_s: float = DEFAULT_WINDOW_S) -> None:
        self._post = post
        self._window_s = window_s
        self._cond = threading.Condition()
        self._handoffs: list[dict[str, Any]] = []
        self._inflight: int | None = None
        self._prekill_done = False
        self._notified_at: float | None = None
        self._first_pending_at: float | None = None
        self._enabled = False
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(
            target=self._run, name="worker-client-reporter", daemon=True
        )
        self._thread.start()

    def enable(self, enabled: bool = True) -> None:
        """Reports are only sent while the worker is registered (they wait otherwise)."""
        with self._cond:
            self._enabled = enabled
            self._cond.notify()

    def handoff(self, request_id: str, tokens: int, detail: str = "",
                ack: str = "router") -> None:
        item: dict[str, Any] = {"request_id": request_id, "tokens": tokens}
        if detail:
            item["detail"] = detail
        if ack != "router":
            item["ack"] = ack
        with self._cond:
            self._handoffs.append(item)
            self._pending()

    def inflight(self, count: int) -> None:
        with self._cond:
            self._inflight = count
            self._pending()

    def notified(self, at: float) -> None:
        """The drain reached the engine (``shutdown_event`` set) at ``at`` (epoch s)."""
        with self._cond:
            self._notified_at = at
            self._pending()

    def prekill_done(self) -> None:
        with self._cond:
            self._prekill_done = True
            self._pending(urgent=True)

    def flush(self, timeout: float) -> bool:
        """Wait until everything collected so far has been sent (True) or ``timeout`` passed."""
        with self._cond:
            self._cond.notify()
        return self._idle.wait(timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _pending(self, urgent: bool = False) -> None:
        self._idle.clear()
        if self._first_pending_at is None or urgent:
            self._first_pending_at = time.monotonic() - (self._window_s if urgent else 0.0)
        self._cond.notify()

    def _has_pending(self) -> bool:
        return (bool(self._handoffs) or self._inflight is not None or self._prekill_done
                or self._notified_at is not None)

    def _run(self) -> None:
        # One tenacity run per report taken: the pause after a failure grows (``_retry``)
        # until a report is sent, and starts over with the next one. Closing ends the run.
        retrying = Retrying(retry=retry_if_exception(report_retryable), wait=report_wait(),
                            sleep=self._pause, reraise=True)
        while not self._closed:
            retrying(self._send_next)

    def _send_next(self) -> None:
        """Wait for something to report, take one batch and post it; on a failure a later
        attempt can fix, put it back (the next attempt takes it again, with what came
        meanwhile) and raise; one no attempt can fix is dropped and logged."""
        with self._cond:
            while not self._closed and not (self._enabled and self._has_pending()):
                if not self._has_pending():
                    self._idle.set()
                self._cond.wait()
            if self._closed:
                return
            # 1. Let the burst gather for the rest of the window.
            assert self._first_pending_at is not None
            while (left := self._first_pending_at + self._window_s - time.monotonic()) > 0:
                self._cond.wait(left)
            # 2. Take the batch.
            report: Report = {}
            taken = batch_size(self._handoffs)
            if taken:
                report["handoffs"] = self._handoffs[:taken]
            if self._inflight is not None:
                report["inflight"] = self._inflight
            if self._prekill_done:
                report["prekill_done"] = True
            if self._notified_at is not None:
                report["notified_at"] = self._notified_at
            self._handoffs = self._handoffs[taken:]
            self._inflight, self._prekill_done, self._notified_at = None, False, None
            # What did not fit goes out next, without another window.
            self._first_pending_at = (time.monotonic() - self._window_s
                                      if self._handoffs else None)
        # 3. Send it.
        try:
            self._post(report)
        except Exception as exc:
            if not report_retryable(exc):
                log.error("%s; dropping the report (%d handoffs)", exc,
                          len(report.get("handoffs", ())))
                return
            self._put_back(report)
            raise

    def _put_back(self, report: Report) -> None:
        """Keep a report that failed for the next attempt (newer in-flight counts win)."""
        with self._cond:
            self._handoffs[:0] = report.get("handoffs", [])
            if self._inflight is None and "inflight" in report:
                self._inflight = report["inflight"]
            self._prekill_done = self._prekill_done or "prekill_done" in report
            if self._notified_at is None:
                self._notified_at = report.get("notified_at")
            self._first_pending_at = time.monotonic()

    def _pause(self, seconds: float) -> None:
        """tenacity's sleep: anything new to report (or closing) cuts it short."""
        with self._cond:
            self._cond.wait(seconds)


def batch_size(handoffs: list[dict[str, Any]]) -> int:
    """How many of ``handoffs`` (from the first) the next report takes."""
    chars = 0
    for count, item in enumerate(handoffs[:MAX_HANDOFFS_PER_REPORT]):
        chars += len(item["request_id"]) + len(item.get("detail", ""))
        if chars > MAX_REPORT_CHARS and count > 0:
            return count
    return min(len(handoffs), MAX_HANDOFFS_PER_REPORT)
