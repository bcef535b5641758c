"""Where the observability files are, and the tools that check them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "deploy" / "observability"
RULES = COMPONENT / "prometheusrule.yaml"
DASHBOARD = COMPONENT / "shutdown-coordinator-dashboard.json"
RULE_TESTS = Path(__file__).with_name("alerts_test.yaml")
METRIC = re.compile(r"\bshutdown_coordinator_[a-z_]+\b")


def promtool() -> str | None:
    """``promtool`` of Debian's ``prometheus`` package (``scripts/test.sh`` installs it)."""
    return shutil.which("promtool") or ("/usr/bin/promtool"
                                        if Path("/usr/bin/promtool").exists() else None)


def rule_spec() -> dict[str, Any]:
    """The PrometheusRule's ``spec``: a plain Prometheus rule file."""
    document = yaml.safe_load(RULES.read_text())
    assert document["kind"] == "PrometheusRule"
    spec: dict[str, Any] = document["spec"]
    return spec


def alerts() -> dict[str, str]:
    """Alert name → expression."""
    return {rule["alert"]: rule["expr"] for group in rule_spec()["groups"]
            for rule in group["rules"] if "alert" in rule}
