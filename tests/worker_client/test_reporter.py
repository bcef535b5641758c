"""The worker client's reports fit what the coordinator accepts, however large the burst."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.servers import register, start_coordinator
from tests.support.processes import ProcessJanitor
from worker_client._reporter import MAX_HANDOFFS_PER_REPORT, Reporter
from worker_client._retry import registration_retryable
from worker_client.errors import CoordinatorRefused

BURST = 12_000
"""More handoffs than one report may carry (the coordinator takes 10,000 at most)."""


def test_a_burst_larger_than_one_report_arrives_whole(janitor: ProcessJanitor,
                                                      tmp_path: Path) -> None:
    """1. a coordinator with the smallest body limit (2 MiB) and a registered worker;
    2. 12,000 handoffs, half with a 1,000-character detail, collected before the reporter
    may send; 3. once enabled, it sends them all (several reports, none refused); 4. the
    coordinator counts every one, with its detail. (One report of 12,000 was refused, 413
    or 422, and retried forever.)"""
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    running = start_coordinator(janitor, tmp_path, "--max-body-bytes", str(2 * 1024 * 1024),
                                "--max-handoffs", str(BURST))
    worker_id = register(running, sleeper.pid)["id"]
    sizes: list[int] = []
    refused: list[str] = []

    with httpx.Client(base_url=running.url, timeout=30) as http:
        def post(report: dict[str, Any]) -> None:
            sizes.append(len(report.get("handoffs", [])))
            answer = http.post(f"/workers/{worker_id}/report", json=report)
            if answer.status_code != 200:
                refused.append(f"{answer.status_code} {answer.text[:200]}")
            answer.raise_for_status()

        reporter = Reporter(post)
        for i in range(BURST):
            reporter.handoff(f"r{i}", tokens=i, detail="d" * 1000 if i % 2 else "")
        reporter.enable()
        assert reporter.flush(timeout=120), f"not all sent; refused: {refused[:3]}"
        reporter.close()

    assert refused == []
    assert sum(sizes) == BURST
    assert max(sizes) <= MAX_HANDOFFS_PER_REPORT
    status = running.status()
    assert status["migration_counts"]["handed_back"] == BURST
    details = {m["request_id"]: m.get("detail") for m in status["migrations"]}
    assert len(details) == BURST
    assert details["r1"] == "d" * 1000


def _refusing(statuses: list[int]) -> tuple[Reporter, list[dict[str, Any]]]:
    """A reporter whose posts are answered with ``statuses`` in turn, then 200."""
    calls: list[dict[str, Any]] = []

    def post(report: dict[str, Any]) -> None:
        calls.append(report)
        if len(calls) <= len(statuses):
            raise CoordinatorRefused(statuses[len(calls) - 1], "refused")

    return Reporter(post), calls


def test_a_limit_reached_is_retried_until_the_report_is_taken() -> None:
    """1. the coordinator answers 429 (a limit of its own reached) twice, then takes the
    report; 2. the reporter sends the same handoffs three times and is then idle."""
    reporter, calls = _refusing([429, 429])
    reporter.handoff("r1", tokens=3)
    reporter.enable()
    assert reporter.flush(timeout=60)
    reporter.close()
    assert [c["handoffs"] for c in calls] == [[{"request_id": "r1", "tokens": 3}]] * 3


def test_a_report_refused_for_good_is_dropped_not_retried_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1. the coordinator answers 422 (a report it will never take); 2. the reporter drops
    it, says so in the log, and is idle; 3. the next report is sent on its own."""
    reporter, calls = _refusing([422])
    reporter.handoff("bad", tokens=1)
    reporter.enable()
    with caplog.at_level("ERROR", logger="worker_client"):
        assert reporter.flush(timeout=60)
    assert len(calls) == 1
    assert "dropping the report (1 handoffs)" in caplog.text
    reporter.handoff("good", tokens=2)
    assert reporter.flush(timeout=60)
    reporter.close()
    assert [c["handoffs"][0]["request_id"] for c in calls] == ["bad", "good"]


@pytest.mark.parametrize(("status", "retried"), [(429, True), (408, True), (503, True),
                                                 (422, False), (401, False)])
def test_registration_retries_what_a_later_attempt_can_fix(status: int, retried: bool) -> None:
    assert registration_retryable(CoordinatorRefused(status, "x")) is retried
