"""The Grafana dashboard against a real coordinator: every metric a panel or an alert
queries is one ``/metrics`` exports after a real drain, and every query is valid PromQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.observability.observability import DASHBOARD, METRIC, alerts, promtool
from tests.support.processes import ProcessJanitor
from tests.timeline.drains import drain_with_everything

GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "6h", "$namespace": ".*"}
"""What Grafana puts in a query before Prometheus sees it."""


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return found


def queries() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name → [(labels, value)] of a Prometheus text page."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(exported: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    return sum(v for found, v in exported.get(name, []) if labels.items() <= found.items())


def test_dashboard_shape() -> None:
    """Panels have unique ids, a Prometheus target each, fit Grafana's 24 columns, and use
    the dashboard's datasource variable."""
    seen = set()
    for panel in panels():
        assert panel["id"] not in seen
        seen.add(panel["id"])
        assert panel["targets"]
        assert panel["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    names = {target["refId"] for panel in panels() for target in panel["targets"]}
    assert names


@pytest.mark.skipif(promtool() is None, reason="promtool is not installed")
def test_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, passes ``promtool check rules`` as a
    recording rule."""
    rules = []
    for index, query in enumerate(queries()):
        for variable, filled in GRAFANA_VARIABLES.items():
            query = query.replace(variable, filled)
        rules.append({"record": f"dashboard:query_{index}", "expr": query})
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [
        {"name": "dashboard", "rules": rules}]}))
    binary = promtool()
    assert binary is not None
    done = subprocess.run([binary, "check", "rules", "queries.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_queried_metric_is_exported_after_a_real_drain(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. A real drain (tests/timeline/drains.py), /metrics read while it ran and after; then
       one request refused at a limit (429).
    2. Every metric a dashboard panel or an alert names is among the samples exported.
    3. The drain shows in them: one drain ``killed``, one process killed, two handoffs
       handed back and acknowledged, one shutdown_event timed, the drain's clock (elapsed,
       budget) while it ran and not after."""
    drained = drain_with_everything(janitor, tmp_path)
    with drained.running.client() as client:  # acknowledgements of nothing reported: early
        refused = client.post("/migrations/ack", json={"request_ids": ["x-1", "x-2"]})
        assert refused.status_code == 429
        assert refused.headers["x-limit"] == "max_early_acks"
    during = samples(drained.metrics_during)
    after_text = httpx.get(drained.running.url + "/metrics", timeout=30).text
    after = samples(after_text)
    exported = set(during) | set(after)
    queried = {name for query in queries() for name in METRIC.findall(query)}
    queried |= {name for expr in alerts().values() for name in METRIC.findall(expr)}
    assert queried - exported == set()
    assert len(queried) >= 14
    assert value(after, "shutdown_coordinator_drains_total", outcome="killed") == 1
    assert value(after, "shutdown_coordinator_drains_started_total") == 1
    assert value(after, "shutdown_coordinator_process_fates_total", fate="killed") == 1
    assert value(after, "shutdown_coordinator_migrations_total", event="handed_back") == 2
    assert value(after, "shutdown_coordinator_migrations_total", event="acked") == 2
    assert value(after, "shutdown_coordinator_shutdown_event_seconds_count") == 1
    assert value(after, "shutdown_coordinator_limit_refusals_total", limit="max_early_acks") == 1
    budget = drained.summary["drain"]["budget_s"]
    assert value(during, "shutdown_coordinator_drain_budget_seconds") == pytest.approx(budget)
    assert "shutdown_coordinator_drain_elapsed_seconds" in during
    assert "shutdown_coordinator_drain_elapsed_seconds" not in after
