"""Random input over the whole OpenAPI schema never makes the coordinator answer 5xx."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck

from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

TOKEN = "schema-token"
EXAMPLES = 40


def test_no_input_makes_it_answer_5xx(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. start a sleeper, and a coordinator confined to the sleeper's subtree (so random
       input can never register or signal a process outside the test) with a short budget
       and long-poll cap;
    2. for every operation of the app's OpenAPI schema, send generated requests (valid and
       invalid), with the token;
    3. none answers 5xx;
    4. the coordinator is still up, and every process it ever listed is the sleeper (the
       only process inside the confinement)."""
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    running = start_coordinator(
        janitor, tmp_path, "--grace-period", "3", "--safety-margin", "1", "--tier-timeout",
        "0.5", "--confirm-timeout", "0.5", "--prekill-timeout", "0.2", "--long-poll-cap",
        "0.2", "--confine-to-pid", str(sleeper.pid), token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    schema = schemathesis.openapi.from_url(running.url + "/openapi.json", headers=headers)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 10

    for operation in operations:
        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None,
                             suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case: Any) -> None:
            response = case.call(headers=headers, timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} {case.body!r} -> "
                                f"{response.status_code} {response.text[:200]}")

        check()

    assert failures == []
    assert running.proc.poll() is None
    status = running.status()
    assert {p["pid"] for p in status["processes"]} <= {sleeper.pid}
    assert {w["pid"] for w in status["workers"]} <= {sleeper.pid}
