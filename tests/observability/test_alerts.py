"""The PrometheusRule's alerts: ``promtool check rules``, ``promtool test rules`` (each alert
firing and not firing), and the kustomize component that ships them with the dashboard."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.rendering import kubectl
from tests.observability.observability import (
    COMPONENT,
    DASHBOARD,
    RULE_TESTS,
    alerts,
    promtool,
    rule_spec,
)

needs_promtool = pytest.mark.skipif(promtool() is None, reason="promtool is not installed "
                                    "(apt-get install prometheus; scripts/test.sh does)")


@needs_promtool
def test_rules_pass_promtool_check_and_unit_tests(tmp_path: Path) -> None:
    """1. Write the PrometheusRule's spec as a rule file; ``promtool check rules`` passes.
    2. ``promtool test rules`` passes tests/observability/alerts_test.yaml.
    3. Every alert is tested both firing and not firing."""
    binary = promtool()
    assert binary is not None
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec(), sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / "alerts_test.yaml")
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "alerts_test.yaml"]):
        done = subprocess.run([binary, *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == quiet == set(alerts())
    assert set(alerts()) == {
        "ShutdownCoordinatorDrainNotGraceful", "ShutdownCoordinatorHandoffsExpired",
        "ShutdownCoordinatorProcessSurvived", "ShutdownCoordinatorDrainOverBudget",
        "ShutdownCoordinatorStateWriteFailures"}


@pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed")
def test_component_renders_the_rules_and_the_dashboard(tmp_path: Path) -> None:
    """``kubectl kustomize`` of an overlay using the component gives the PrometheusRule as
    written and the dashboard in a ConfigMap labelled for Grafana's sidecar."""
    shutil.copytree(COMPONENT, tmp_path / "observability")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text("components:\n  - ../observability\n")
    binary = kubectl()
    assert binary is not None
    done = subprocess.run([binary, "kustomize", str(overlay)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(done.stdout) if d}
    assert set(docs) == {"PrometheusRule", "ConfigMap"}
    assert docs["PrometheusRule"]["spec"] == rule_spec()
    config_map = docs["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"][DASHBOARD.name]) == json.loads(DASHBOARD.read_text())
