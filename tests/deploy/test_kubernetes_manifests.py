"""Every Kubernetes variant renders, validates against each supported Kubernetes version's
schemas, and keeps the wiring the drain depends on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils

from coordinator.drain import budget
from tests.deploy import crd_schemas
from tests.deploy.invariants import CHECKS
from tests.deploy.rendering import (
    ENGINE,
    REPO,
    VARIANTS,
    Rendered,
    Variant,
    kubectl,
    render,
    stage,
)

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl is not installed: cannot run `kubectl kustomize`"
)


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stage(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module")
def renders(staged: Path) -> dict[str, Rendered]:
    return {v.name: Rendered(v, render(staged, v)) for v in VARIANTS}


def _validate(doc: dict[str, Any], version: str) -> None:
    if doc["apiVersion"].startswith(crd_schemas.PROMETHEUS_OPERATOR_GROUP):
        crd_schemas.validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_variant_validates_against_every_supported_version(
    variant: Variant, renders: dict[str, Rendered]
) -> None:
    """1. Render the variant with kubectl kustomize.
    2. Validate every object in strict mode (unknown fields are errors) against each
       Kubernetes version the variant supports; CRDs against their own schema.
    """
    rendered = renders[variant.name]
    kinds = sorted(doc["kind"] for doc in rendered.docs)
    assert "Deployment" in kinds
    # The engine's and the coordinators'; and the continuation proxy's with it.
    assert kinds.count("Service") == 2 + ("continuation-proxy" in variant.components)
    for version in variant.versions:
        for doc in rendered.docs:
            _validate(doc, version)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_variant_keeps_invariant(
    variant: Variant, check: str, renders: dict[str, Rendered]
) -> None:
    """1. Take the rendered variant.
    2. Run one invariant check on it (see tests/deploy/invariants.py).
    """
    CHECKS[check](renders[variant.name])


def test_native_sidecar_needs_kubernetes_1_29(renders: dict[str, Rendered]) -> None:
    """1. Take the native-sidecar rendering of the vLLM overlay.
    2. Validate its Deployment against Kubernetes 1.27, which has no container restartPolicy.
    3. Expect the strict schema to reject it: the classic variant is the one for old clusters.
    """
    deployment = renders["vllm"].deployment
    with pytest.raises(kv_utils.ValidationError):
        kubernetes_validate.validate(deployment, "1.27", strict=True)


def _broken(rendered: Rendered, change: str) -> Rendered:
    docs = copy.deepcopy(rendered.docs)
    broken = Rendered(rendered.variant, docs)
    pod = broken.pod
    engine = broken.engine
    coordinator = broken.coordinator
    if change == "budget":
        pod["terminationGracePeriodSeconds"] += 30
    elif change == "port":
        engine["readinessProbe"]["httpGet"]["port"] += 1
    elif change == "prestop":
        engine["lifecycle"]["preStop"] = {"exec": {"command": ["sleep", "30"]}}
    elif change == "token":
        engine["volumeMounts"] = [
            m for m in engine["volumeMounts"] if m["name"] != "coordinator-token"
        ]
    elif change == "sidecar":
        del coordinator["restartPolicy"]
    elif change == "process-namespace":
        pod["shareProcessNamespace"] = False
    elif change == "probes":
        engine["readinessProbe"]["httpGet"]["path"] = "/health"
    elif change == "security-context":
        coordinator["securityContext"]["capabilities"]["add"] = ["KILL", "SYS_PTRACE"]
    elif change == "writable-paths":
        coordinator["volumeMounts"] = [
            m for m in coordinator["volumeMounts"] if m["name"] != "coordinator-state"
        ]
    elif change == "metrics":
        broken.deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "1"
    elif change == "coordinator-service":
        service = broken.named("Service", "inference-engine-coordinator")
        service["spec"]["publishNotReadyAddresses"] = False
    elif change == "adoption":
        config = broken.named("ConfigMap", _config_name(broken))
        config["data"]["SHUTDOWN_COORDINATOR_ADOPT_PATTERNS"] = "python3"
    elif change == "continuation":
        proxy = broken.named("Deployment", "continuation-proxy")["spec"]["template"]["spec"]
        proxy["containers"][0]["args"][0] = "--upstream=http://smg.default.svc.cluster.local:30000"
    elif change == "engine-profile":
        config = broken.named("ConfigMap", _config_name(broken))
        del config["data"]["SHUTDOWN_COORDINATOR_ENGINE"]
    elif change == "secure-start":
        config = broken.named("ConfigMap", _config_name(broken))
        del config["data"]["SHUTDOWN_COORDINATOR_TOKEN_FILE"]
    elif change == "router-worker-url":
        env = broken.env(coordinator)
        env["SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL"]["value"] = "http://$(POD_IP):8001"
    elif change == "instance-selectors":
        for service in broken.of_kind("Service"):
            service["spec"]["selector"].pop("app.kubernetes.io/instance")
    elif change == "disruption-budget":
        budget = broken.of_kind("PodDisruptionBudget")[0]["spec"]
        budget["minAvailable"] = budget.pop("maxUnavailable")
    elif change == "service-account-token":
        del pod["automountServiceAccountToken"]
    elif change == "engine-requests":
        del engine["resources"]["requests"]["memory"]
    elif change == "pinned-images":
        engine["image"] = engine["image"].rsplit(":", 1)[0] + ":latest"
    else:  # pragma: no cover - a new check needs its own breakage here
        raise AssertionError(f"no breakage for {change}")
    return broken


def _config_name(rendered: Rendered) -> str:
    refs = rendered.coordinator["envFrom"]
    return str(refs[0]["configMapRef"]["name"])


_SOURCES = {"adoption": "adopted-vllm", "router-worker-url": "trtllm-vllm-router",
            "continuation": "vllm-migrating"}
"""The rendering each check is broken in, when not the vLLM overlay's."""


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_invariant_catches_its_breakage(check: str, renders: dict[str, Rendered]) -> None:
    """1. Break one thing in a correct rendering (``_SOURCES``'s, vLLM's otherwise).
    2. Expect that invariant's check to fail, so the check is not vacuous.
    """
    source = renders[_SOURCES.get(check, "vllm")]
    CHECKS[check](source)
    with pytest.raises(AssertionError):
        CHECKS[check](_broken(source, check))


def test_engine_container_is_named_for_the_checks(renders: dict[str, Rendered]) -> None:
    """1. Every variant has exactly one engine container, named as the checks expect."""
    for rendered in renders.values():
        assert [c["name"] for _, c in rendered.containers()].count(ENGINE) == 1


DOC_ROWS = {
    "sglang": "| sglang, trtllm, vllm |",
    "trtllm": "| sglang, trtllm, vllm |",
    "vllm": "| sglang, trtllm, vllm |",
    "dynamo-worker": "| dynamo-worker |",
    "adopted-vllm": "| adopted-vllm |",
    "vllm-migrating": "| vllm-migrating |",
    "sglang-migrating": "| sglang-migrating |",
}


@pytest.mark.parametrize("overlay", sorted(DOC_ROWS))
def test_documented_budget_matches_the_overlay(overlay: str, renders: dict[str, Rendered]) -> None:
    """1. Take the overlay's grace period, safety margin and min-drain as rendered.
    2. Split the budget with the coordinator's own arithmetic (coordinator.drain.budget).
    3. docs/deploy.md's budget table shows exactly those numbers for the overlay.
    """
    settings = renders[overlay].settings
    grace = float(settings["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"])
    margin = float(settings["SHUTDOWN_COORDINATOR_SAFETY_MARGIN_S"])
    split = budget.split_budget(
        budget.total_budget(grace, margin),
        tier_timeout_s=10.0,
        confirm_s=2.0,
        min_drain_s=float(settings["SHUTDOWN_COORDINATOR_MIN_DRAIN_S"]),
    )
    numbers = [grace, margin, split.total_s, split.migration_s, split.termination_s]
    expected = " | ".join(f"{n:g}" for n in [*numbers, split.min_drain_s])
    doc = (REPO / "docs" / "deploy.md").read_text()
    # The budget table's row: its cells after the name are numbers (the pod table's rows
    # start with the overlay's name too).
    rows = [line for line in doc.splitlines() if line.startswith(DOC_ROWS[overlay])
            and line.split("|")[2].strip().isdigit()]
    assert len(rows) == 1, rows
    assert rows[0].endswith(f"| {expected} |"), rows[0]
