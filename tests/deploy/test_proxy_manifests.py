"""The continuation proxy's manifests (``deploy/kubernetes/continuation-proxy``): they render,
validate against every supported Kubernetes version, start the program with arguments it
accepts, and reach the pods' coordinators the way the base deploys them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from continuation_proxy import discovery
from continuation_proxy.cli import parse_args
from tests.deploy.rendering import CLASSIC_SIDECAR_VERSIONS, KUBERNETES_DIR, kubectl

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is needed to render")

PROXY_DIR = KUBERNETES_DIR / "continuation-proxy"
BASE = KUBERNETES_DIR / "base"


def _render(directory: Path) -> list[dict[str, Any]]:
    binary = kubectl()
    assert binary is not None
    done = subprocess.run([binary, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return _render(PROXY_DIR)


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _one(docs, "Deployment")["spec"]["template"]["spec"][
        "containers"]
    assert len(containers) == 1
    return containers[0]


def _flags(container: dict[str, Any]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


@pytest.mark.parametrize("version", CLASSIC_SIDECAR_VERSIONS)
def test_the_proxy_validates_against_every_supported_version(
        docs: list[dict[str, Any]], version: str) -> None:
    """Every rendered object, strictly (an unknown or misspelled field is an error)."""
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_program_accepts_the_rendered_arguments(docs: list[dict[str, Any]]) -> None:
    """1. The container runs the console script the distribution installs.
    2. Its arguments parse with the proxy's own command line (a typo would exit 2 in the
       pod); it listens on every address, on the container port the probes and the Service
       use."""
    container = _container(docs)
    assert container["command"] == ["continuation-proxy"]
    scripts = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert 'continuation-proxy = "continuation_proxy.cli:main"' in scripts.read_text()
    args = parse_args(container["args"])
    assert args.host == "0.0.0.0"
    port = container["ports"][0]
    assert (port["name"], port["containerPort"]) == ("http", args.port)
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == _one(docs, "Deployment")["spec"]["selector"][
        "matchLabels"]


def test_the_proxy_finds_the_coordinators_the_base_deploys(docs: list[dict[str, Any]]) -> None:
    """1. ``--coordinators-dns`` names the base's headless coordinator Service (every pod's
       address, not-Ready ones too: a draining pod is not Ready) on the coordinators' port.
    2. ``--token-file`` is in a mount of the Secret the coordinators read, which the pod's
       group can read (0440, fsGroup)."""
    base = _render(BASE)
    service = next(d for d in base if d["kind"] == "Service"
                   and d["spec"].get("clusterIP") == "None")
    assert service["spec"]["publishNotReadyAddresses"] is True
    config = next(d for d in base if d["kind"] == "ConfigMap"
                  and "SHUTDOWN_COORDINATOR_PORT" in d.get("data", {}))
    flags = _flags(_container(docs))
    name, port = discovery.parse_name(flags["coordinators-dns"])
    assert name.split(".")[0] == service["metadata"]["name"]
    assert port == int(config["data"]["SHUTDOWN_COORDINATOR_PORT"])
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in _container(docs)["volumeMounts"]
                 if flags["token-file"].startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    base_pod = next(d for d in base if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    secrets = {v["secret"]["secretName"] for v in base_pod["volumes"] if "secret" in v}
    assert volume["secret"]["secretName"] in secrets
    assert volume["secret"]["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
