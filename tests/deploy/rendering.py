"""Render the Kubernetes manifests the way a user would (``kubectl kustomize``), offline.

The tree under ``deploy/kubernetes`` is copied to a scratch directory first, so a test can
add what a user adds (the ``token.env`` of the token-secret component, a kustomization combining
optional components) without touching the repository.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_DIR = REPO / "deploy" / "kubernetes"
DRAIN_HOOK = KUBERNETES_DIR / "base" / "drain_hook.py"
COORDINATOR = "shutdown-coordinator"
ENGINE = "engine"
TEST_TOKEN = "test-token-0123456789abcdef"

NATIVE_SIDECAR_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
"""Native sidecars (init containers with restartPolicy Always) are on by default from 1.29."""
CLASSIC_SIDECAR_VERSIONS = ("1.25", "1.26", "1.27", "1.28", *NATIVE_SIDECAR_VERSIONS)


@dataclass(frozen=True)
class Variant:
    """One way of deploying: an engine, optional components, and where it comes from."""

    name: str
    engine: str
    components: tuple[str, ...] = ()
    shipped: bool = False
    """True for the overlays in deploy/kubernetes/overlays (rendered as they are)."""
    registers: bool = False
    """The engine registers through worker_client (a drainable server) instead of being
    adopted by its profile's patterns: the migrating overlays."""

    @property
    def native_sidecar(self) -> bool:
        return "classic-sidecar" not in self.components

    @property
    def versions(self) -> tuple[str, ...]:
        return NATIVE_SIDECAR_VERSIONS if self.native_sidecar else CLASSIC_SIDECAR_VERSIONS


SHIPPED = (
    Variant("sglang", "sglang", shipped=True),
    Variant("trtllm", "trtllm", shipped=True),
    Variant("vllm", "vllm", shipped=True),
    Variant("dynamo-worker", "dynamo-worker", shipped=True),
    Variant("adopted-vllm", "adopted-vllm", ("engine-as-root",), shipped=True),
    Variant("vllm-migrating", "vllm-drainable", ("router-vllm-router", "continuation-proxy"),
            shipped=True, registers=True),
    Variant("sglang-migrating", "sglang-drainable", ("router-vllm-router", "continuation-proxy"),
            shipped=True, registers=True),
)
COMBINED = (
    Variant("vllm-classic", "vllm", ("classic-sidecar",)),
    Variant("sglang-httpget", "sglang", ("token-secret", "prestop-httpget")),
    Variant("vllm-locked-down", "vllm", ("token-secret", "network-policy")),
    Variant("dynamo-servicemonitor", "dynamo-worker", ("servicemonitor",)),
    Variant("sglang-smg", "sglang", ("router-smg",)),
    Variant("trtllm-vllm-router", "trtllm", ("router-vllm-router", "classic-sidecar")),
    Variant(
        "adopted-everything",
        "adopted-vllm",
        ("engine-as-root", "servicemonitor", "network-policy", "classic-sidecar",
         "token-secret", "prestop-httpget"),
    ),
)
VARIANTS = SHIPPED + COMBINED
ENGINE_INIT = Variant("vllm-init", "adopted-vllm", ("engine-init",), shipped=True)
"""The overlay with the coordinator as the engine container's init: no sidecar, so none of
the sidecar checks over ``VARIANTS`` apply (tests/deploy/test_engine_init_manifests.py)."""


def kubectl() -> str | None:
    return shutil.which("kubectl")


def stage(scratch: Path) -> Path:
    """Copy the manifests to ``scratch`` and add what a user adds; the copy's root."""
    root = scratch / "kubernetes"
    shutil.copytree(KUBERNETES_DIR, root)
    (root / "components" / "token-secret" / "token.env").write_text(f"token={TEST_TOKEN}\n")
    return root


def kustomization_for(variant: Variant) -> str:
    components = [f"../../engines/{variant.engine}"]
    components += [f"../../components/{name}" for name in variant.components]
    components.append("../../components/budget")
    lines = ["resources:", "  - ../../base", "components:"]
    lines += [f"  - {path}" for path in components]
    return "\n".join(lines) + "\n"


def render(root: Path, variant: Variant) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one variant, parsed."""
    if variant.shipped:
        directory = root / "overlays" / variant.name
    else:
        directory = root / "variants" / variant.name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "kustomization.yaml").write_text(kustomization_for(variant))
    return kustomize(directory)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one directory, parsed."""
    binary = kubectl()
    assert binary is not None
    done = subprocess.run(
        [binary, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


class Rendered:
    """Accessors for the pieces of one rendered variant the checks look at."""

    def __init__(self, variant: Variant, docs: list[dict[str, Any]]) -> None:
        self.variant = variant
        self.docs = docs

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc.get("kind") == kind]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        """The engine pods' Deployment (a migrating overlay also deploys the continuation
        proxy's)."""
        deployments = [d for d in self.of_kind("Deployment")
                       if any(c["name"] == ENGINE for c in
                              d["spec"]["template"]["spec"].get("containers") or [])]
        assert len(deployments) == 1, "expected exactly one engine Deployment"
        return deployments[0]

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.deployment["spec"]["template"]["spec"]
        return spec

    def containers(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every container with the list it is in (``initContainers`` or ``containers``)."""
        for key in ("initContainers", "containers"):
            for container in self.pod.get(key) or []:
                yield key, container

    def container(self, name: str) -> dict[str, Any]:
        found = [c for _, c in self.containers() if c["name"] == name]
        assert len(found) == 1, f"expected one container {name}, found {len(found)}"
        return found[0]

    @property
    def coordinator(self) -> dict[str, Any]:
        return self.container(COORDINATOR)

    @property
    def engine(self) -> dict[str, Any]:
        return self.container(ENGINE)

    @property
    def settings(self) -> dict[str, str]:
        """The coordinator's environment settings: the ConfigMap its envFrom names."""
        refs = [e["configMapRef"]["name"] for e in self.coordinator.get("envFrom") or []]
        assert len(refs) == 1, "the coordinator loads exactly one ConfigMap"
        data: dict[str, str] = self.named("ConfigMap", refs[0])["data"]
        return data

    @property
    def port(self) -> int:
        return int(self.settings["SHUTDOWN_COORDINATOR_PORT"])

    def volume(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            v for v in self.pod.get("volumes") or [] if v["name"] == name
        ]
        assert len(found) == 1, f"expected one volume {name}"
        return found[0]

    def volume_at(self, container: dict[str, Any], path: str) -> dict[str, Any] | None:
        """The volume whose mount in ``container`` holds ``path`` (deepest mount wins)."""
        best: tuple[int, str] | None = None
        for mount in container.get("volumeMounts") or []:
            prefix = mount["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), mount["name"])
        return None if best is None else self.volume(best[1])

    def env(self, container: dict[str, Any]) -> dict[str, Any]:
        return {item["name"]: item for item in container.get("env") or []}

    def secret_value(self, name: str, key: str) -> str | None:
        """A Secret's value from the render, or None when the Secret is created out of band."""
        found = [s for s in self.of_kind("Secret") if s["metadata"]["name"] == name]
        if not found:
            return None
        secret = found[0]
        if key in (secret.get("stringData") or {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()

    def effective(self, container: dict[str, Any], field: str) -> Any:
        """A securityContext field as the kubelet applies it: container, else pod."""
        own = container.get("securityContext") or {}
        if field in own:
            return own[field]
        return (self.pod.get("securityContext") or {}).get(field)
