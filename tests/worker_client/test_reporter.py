"""The worker client's reports fit what the coordinator accepts, however large the burst."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx

from tests.service.servers import register, start_coordinator
from tests.support.processes import ProcessJanitor
from worker_client._reporter import MAX_HANDOFFS_PER_REPORT, Reporter

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
    running = start_coordinator(janitor, tmp_path, "--max-body-bytes", str(2 * 1024 * 1024))
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
