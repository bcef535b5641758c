"""components/engine-init and overlays/vllm-init: the coordinator as the engine container's
init. Rendered as a user renders them, validated, and their settings accepted by ``run``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from coordinator.cli import build_parser
from coordinator.cli.serve import checked_settings
from coordinator.engines import PROFILES
from tests.deploy.rendering import (
    ENGINE_INIT,
    NATIVE_SIDECAR_VERSIONS,
    Rendered,
    kubectl,
    kustomize,
    stage,
)

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl is not installed: cannot run `kubectl kustomize`"
)
POD_IP = "10.1.2.3"
"""What the downward API gives ``status.podIP`` in the settings check."""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    root = stage(tmp_path_factory.mktemp("deploy"))
    return Rendered(ENGINE_INIT, kustomize(root / "overlays" / ENGINE_INIT.name))


def _settings_env(rendered: Rendered) -> dict[str, str]:
    """The engine container's environment as the kubelet gives it: the ConfigMap it loads,
    then its own variables (the downward API's pod IP, the ConfigMap keys it names)."""
    engine = rendered.engine
    refs = [e["configMapRef"]["name"] for e in engine.get("envFrom") or []]
    assert len(refs) == 1
    env: dict[str, str] = dict(rendered.named("ConfigMap", refs[0])["data"])
    for name, item in rendered.env(engine).items():
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "status.podIP"
            env[name] = POD_IP
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[name] = rendered.named("ConfigMap", ref["name"])["data"][ref["key"]]
        else:
            env[name] = item["value"]
    return env


def test_it_validates_against_every_supported_version(rendered: Rendered) -> None:
    """Every object, strict (unknown fields are errors), for each Kubernetes version."""
    for version in NATIVE_SIDECAR_VERSIONS:
        for doc in rendered.docs:
            kubernetes_validate.validate(doc, version, strict=True)


def test_no_sidecar_no_shared_pid_namespace_no_secret_no_hook(rendered: Rendered) -> None:
    """1. One container, the engine; no init container; no shared PID namespace.
    2. No Secret anywhere (no volume, no reference); no preStop hook; no volume nothing
       mounts; the drain hook's ConfigMap is gone with the hook."""
    pod = rendered.pod
    assert [c["name"] for _, c in rendered.containers()] == ["engine"]
    assert not pod.get("shareProcessNamespace")
    assert not rendered.of_kind("Secret")
    assert "secret" not in str(pod)
    assert "lifecycle" not in rendered.engine
    mounted = {m["name"] for m in rendered.engine.get("volumeMounts") or []}
    assert {v["name"] for v in pod.get("volumes") or []} == mounted
    assert [c["metadata"]["name"].rsplit("-", 1)[0] for c in rendered.of_kind("ConfigMap")] \
        == ["shutdown-coordinator"]


def test_the_engine_runs_behind_the_coordinator(rendered: Rendered) -> None:
    """The engine container's command is ``shutdown-coordinator run --`` and then the
    engine's own command, unchanged; its args follow, unchanged."""
    engine = rendered.engine
    assert engine["command"] == ["shutdown-coordinator", "run", "--", "python3", "-m",
                                 "vllm.entrypoints.openai.api_server"]
    assert "--shutdown-timeout=30" in engine["args"]
    assert engine["image"].endswith("-init")


def test_run_accepts_its_settings_and_the_probes_reach_it(rendered: Rendered,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """1. The settings the container gets (ConfigMap, downward API) are accepted by ``run``:
       the API on loopback with no token, the public address the pod's IP, vLLM's profile,
       the grace period the pod's.
    2. The readiness probe and the scrape annotation name the coordinator's port, which the
       public address serves (/readyz, /metrics)."""
    env = _settings_env(rendered)
    for name, val in env.items():
        if name.startswith("SHUTDOWN_COORDINATOR_"):
            monkeypatch.setenv(name, val)
    args: argparse.Namespace = build_parser().parse_args(
        ["run", *rendered.engine["command"][2:], *rendered.engine["args"]])
    checked = checked_settings(args, "run")
    assert checked is not None, capsys.readouterr().err
    settings, posture = checked
    assert settings.host == "127.0.0.1"
    assert settings.public_host == POD_IP
    assert posture.token is None
    assert settings.engine == "vllm"
    assert settings.adopt_tiers == list(PROFILES["vllm"].tiers)
    assert settings.grace_period_s == rendered.pod["terminationGracePeriodSeconds"]
    port = settings.port
    probe: dict[str, Any] = rendered.engine["readinessProbe"]["httpGet"]
    assert (probe["path"], int(probe["port"])) == ("/readyz", port)
    annotations = rendered.deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port


def test_the_component_goes_with_any_engine(tmp_path: Path) -> None:
    """The component works on the other engines' components too (SGLang here): the engine's
    own command behind the coordinator's."""
    root = stage(tmp_path)
    variant = root / "variants" / "sglang-init"
    variant.mkdir(parents=True)
    (variant / "kustomization.yaml").write_text(
        "resources:\n  - ../../base\ncomponents:\n  - ../../engines/sglang\n"
        "  - ../../components/engine-init\n  - ../../components/budget\n")
    docs = kustomize(variant)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert engine["command"] == ["shutdown-coordinator", "run", "--", "python3", "-m",
                                 "sglang.launch_server"]
    for doc in docs:
        kubernetes_validate.validate(doc, NATIVE_SIDECAR_VERSIONS[-1], strict=True)
