"""Random input over the whole OpenAPI schema, judged by every schemathesis check: no 5xx,
every status code and content type as documented, every body as its schema says, and the
token required where the schema says it is."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis import checks

from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

TOKEN = "schema-token"
EXAMPLES = 120
"""Per operation at most, with the token (operations with few distinct inputs take fewer;
over 1,000 cases in all)."""
EXAMPLES_WITHOUT_TOKEN = 3
SEMANTIC = [checks.positive_data_acceptance]
"""Left out: a schema-valid registration of a PID that does not exist, or lies outside the
confinement, is refused (422, 403) by what the host holds, which no schema can say."""
READINESS = "/readyz"
"""Answers 503 by design once a drain started (the kubelet's readiness signal): there the
no-5xx check is replaced by the documented pair, 200 or 503."""


def run_all_checks(operations: list[Any], headers: dict[str, str], examples: int,
                   failures: list[str]) -> int:
    """Every check on ``examples`` generated cases per operation; returns the case count."""
    cases = 0
    for operation in operations:
        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=examples, deadline=None, database=None,
                             suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case: Any) -> None:
            nonlocal cases
            cases += 1
            excluded = SEMANTIC
            if case.path == READINESS:
                excluded = [*SEMANTIC, checks.not_a_server_error]
            try:
                response = case.call_and_validate(headers=headers, timeout=30,
                                                  excluded_checks=excluded)
                if case.path == READINESS and response.status_code not in (200, 503):
                    failures.append(f"{READINESS} answered {response.status_code}")
            except BaseException as exc:  # schemathesis raises a FailureGroup
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append(f"{case.method} {case.formatted_path}: "
                                f"{type(exc).__name__}: {str(exc)[:800]}")

        check()
    return cases


@pytest.mark.timeout(600)  # 1,000+ requests: 70 s alone under load, 180+ s beside a worker
def test_the_api_answers_as_its_schema_says(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. start a sleeper, and a coordinator confined to the sleeper's subtree (so random
       input can never register or signal a process outside the test) with a short budget
       and long-poll cap, and a token;
    2. for every operation of its OpenAPI schema (fetched with the token), generated requests
       (valid and invalid) with the token, up to 120 per operation, then 3 without it;
    3. every schemathesis check passes on every answer but the one about semantics (see
       ``SEMANTIC``): no 5xx, status codes and content types documented, bodies conforming,
       and operations that require the token refuse a request without it;
    4. the coordinator is still up, and every process it ever listed is the sleeper."""
    sleeper = janitor.spawn(["sleep", "600"], service=True, exit_code=-signal.SIGTERM)
    running = start_coordinator(
        janitor, tmp_path, "--grace-period", "3", "--safety-margin", "1", "--tier-timeout",
        "0.5", "--confirm-timeout", "0.5", "--prekill-timeout", "0.2", "--long-poll-cap",
        "0.2", "--confine-to-pid", str(sleeper.pid), token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    schema = schemathesis.openapi.from_url(running.url + "/openapi.json", headers=headers)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 10
    failures: list[str] = []

    cases = run_all_checks(operations, headers, EXAMPLES, failures)
    cases_without_token = run_all_checks(operations, {}, EXAMPLES_WITHOUT_TOKEN, failures)

    assert failures == []
    assert cases >= 1000, cases
    assert cases_without_token >= len(operations)
    assert running.proc.poll() is None
    status = running.status()
    assert {p["pid"] for p in status["processes"]} <= {sleeper.pid}
    assert {w["pid"] for w in status["workers"]} <= {sleeper.pid}
