"""What a platform team does with the manifests beyond one overlay: two models in one
namespace, the coordinator's port closed to all but its clients, the token Secret from a
generator, and overlays whose comments say what they really run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.invariants import INSTANCE, selectors
from tests.deploy.rendering import (
    KUBERNETES_DIR,
    SHIPPED,
    Rendered,
    Variant,
    kubectl,
    kustomize,
    render,
    stage,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl renders the manifests")

VLLM = next(v for v in SHIPPED if v.name == "vllm")


def _model(root: Path, prefix: str, overlay: str, components: tuple[str, ...] = ()) -> Rendered:
    """A model of one's own: a shipped overlay (and components) under ``prefix``."""
    directory = root / "models" / prefix
    directory.mkdir(parents=True)
    lines = [f"namePrefix: {prefix}-", "resources:", f"  - ../../{overlay}"]
    if components:
        lines += ["components:", *(f"  - ../../components/{c}" for c in components)]
    (directory / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return Rendered(Variant(prefix, "vllm", components), kustomize(directory))


def _pod_labels(rendered: Rendered) -> dict[str, str]:
    labels: dict[str, str] = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", ["overlays/vllm", "overlays/adopted-vllm", "lws"])
def test_two_models_in_one_namespace_never_select_each_others_pods(
    overlay: str, tmp_path: Path
) -> None:
    """1. Two models from the same overlay in one namespace, each under its own namePrefix
       (``qwen-``, ``llama-``), with the ServiceMonitor and the NetworkPolicy.
    2. Every selector of each (Deployment or LeaderWorkerSet pods, both Services, the
       disruption budget, the NetworkPolicy and its peers, the ServiceMonitor) selects its
       own model's pods (or coordinator Service) and not the other's."""
    root = stage(tmp_path)
    extra = ("servicemonitor", "network-policy")
    if overlay == "lws":
        docs = {p: kustomize(_lws_model(root, p)) for p in ("qwen", "llama")}
        pods = {p: _lws_pod_labels(d) for p, d in docs.items()}
        found = {p: _lws_selectors(d) for p, d in docs.items()}
    else:
        models = {p: _model(root, p, overlay, extra) for p in ("qwen", "llama")}
        pods = {p: _pod_labels(m) for p, m in models.items()}
        found = {p: selectors(m) for p, m in models.items()}
    assert pods["qwen"][INSTANCE] != pods["llama"][INSTANCE]
    for own, other in (("qwen", "llama"), ("llama", "qwen")):
        for where, selector in found[own]:
            if where.startswith("ServiceMonitor"):
                continue  # it selects Services: checked through their labels below
            assert _matches(selector, pods[own]), (own, where, selector)
            assert not _matches(selector, pods[other]), (own, where, selector)


def _lws_model(root: Path, prefix: str) -> Path:
    directory = root / "models" / prefix
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(
        f"namePrefix: {prefix}-\nresources:\n  - ../../lws\n")
    return directory


def _lws_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    labels: dict[str, str] = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"][
        "labels"]
    return labels


def _lws_selectors(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    found = [(f"Service {d['metadata']['name']}", d["spec"]["selector"])
             for d in docs if d["kind"] == "Service"]
    found += [(f"PodDisruptionBudget {d['metadata']['name']}",
               d["spec"]["selector"]["matchLabels"])
              for d in docs if d["kind"] == "PodDisruptionBudget"]
    # The leaders' Service selects by role too: a worker's labels with the leader's role.
    return [(w, {k: v for k, v in s.items() if k != "app.kubernetes.io/component"})
            for w, s in found]


def test_the_network_policy_lets_in_the_engines_clients_and_the_coordinators_own(
    tmp_path: Path
) -> None:
    """The vLLM overlay with components/network-policy: 1. it selects the pods; 2. the
    engine's port (the container port named ``http``) is open to every source; 3. the
    coordinator's port (named ``coordinator``, as the coordinator container names its own)
    only to pods labelled ``shutdown-coordinator/client: "true"`` in any namespace and to
    this model's pods; 4. the continuation proxy's pods carry that label."""
    rendered = Rendered(Variant("np", "vllm", ("network-policy",)),
                        render(stage(tmp_path), Variant("np", "vllm", ("network-policy",))))
    (policy,) = rendered.of_kind("NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert _matches(spec["podSelector"]["matchLabels"], _pod_labels(rendered))
    rules = {rule["ports"][0]["port"]: rule for rule in spec["ingress"]}
    assert {p["name"] for p in rendered.engine["ports"]} >= {"http"}
    assert {p["name"] for p in rendered.coordinator["ports"]} == {"coordinator"}
    assert set(rules) == {"http", "coordinator"}
    assert "from" not in rules["http"]
    peers = rules["coordinator"]["from"]
    assert {"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "shutdown-coordinator/client": "true"}}} in peers
    own = [p for p in peers if "namespaceSelector" not in p]
    assert len(own) == 1
    assert _matches(own[0]["podSelector"]["matchLabels"],
                                      _pod_labels(rendered))
    proxy = kustomize(KUBERNETES_DIR / "continuation-proxy")
    (deployment,) = [d for d in proxy if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels.get("shutdown-coordinator/client") == "true"


def test_the_token_secret_is_generated_and_its_absence_named(tmp_path: Path) -> None:
    """1. components/token-secret with its token.env: the Secret the pod mounts holds that
       token (and keeps its name, which the proxy reads). 2. Without token.env, kustomize
       stops naming the file to write. 3. prestop-httpget without token-secret stops naming
       the component it needs; with it, the hook's header carries the same token."""
    root = stage(tmp_path)
    variant = Variant("generated", "vllm", ("token-secret",))
    rendered = Rendered(variant, render(root, variant))
    secret = rendered.pod["volumes"]
    mounted = next(v for v in secret if v["name"] == "coordinator-token")
    assert mounted["secret"]["secretName"] == "shutdown-coordinator-token"
    assert rendered.secret_value("shutdown-coordinator-token", "token") == (
        (root / "components" / "token-secret" / "token.env").read_text().strip()
        .removeprefix("token="))

    (root / "components" / "token-secret" / "token.env").unlink()
    with pytest.raises(AssertionError, match=r"components/token-secret/token\.env: no such"):
        render(root, Variant("missing", "vllm", ("token-secret",)))
    with pytest.raises(AssertionError, match=r"nothing selected by .*ConfigMap.*"
                                             r"token-from-components-token-secret"):
        render(root, Variant("alone", "vllm", ("prestop-httpget",)))


OVERLAY_USERS = {"vllm": (1000, "UID 1000"), "adopted-vllm": (0, "root")}


@pytest.mark.parametrize("name", sorted(OVERLAY_USERS))
def test_the_vllm_overlays_run_the_user_their_comments_say(name: str, tmp_path: Path) -> None:
    """``vllm`` and ``adopted-vllm`` run the same stock image and command; what tells them
    apart is the user (UID 1000, root) and --min-drain, and each overlay's comment says
    which user it runs, the other's too, as the render has it."""
    root = stage(tmp_path)
    variant = next(v for v in SHIPPED if v.name == name)
    rendered = Rendered(variant, render(root, variant))
    uid, word = OVERLAY_USERS[name]
    assert rendered.effective(rendered.engine, "runAsUser") == uid
    assert rendered.effective(rendered.coordinator, "runAsUser") == uid
    other = Rendered(VLLM, render(root, VLLM)) if name != "vllm" else None
    if other is not None:
        assert rendered.engine["image"] == other.engine["image"]
        assert rendered.engine["command"] == other.engine["command"]
    comment = "\n".join(line for line in
                        (KUBERNETES_DIR / "overlays" / name / "kustomization.yaml")
                        .read_text().splitlines() if line.startswith("#"))
    assert re.search(rf"\bas {word}\b|\bas the image's own user, {word}\b", comment), comment
    for other_name, (_, other_word) in OVERLAY_USERS.items():
        if other_name != name:
            assert f"as {other_word}" in comment, comment


PROFILE_ONLY = "No code change: readiness and ordered kill, streams waited for."
"""What an overlay that runs a stock engine is, first in its comment."""


def test_each_overlay_says_first_whether_its_streams_move_or_are_waited_for() -> None:
    """Every overlay's comment opens with what it does to in-flight streams: the migrating
    ones (their engine registers) that the streams move to another pod, the others that they
    are waited for, with no code change; and docs/deploy.md's first `kubectl apply` is a
    migrating overlay, the path the docs lead to first."""
    registering = {v.name for v in SHIPPED if v.registers}
    assert registering
    for directory in sorted((KUBERNETES_DIR / "overlays").iterdir()):
        lines = (directory / "kustomization.yaml").read_text().splitlines()
        comment = " ".join(line.removeprefix("#").strip() for line in lines
                           if line.startswith("#"))
        if directory.name in registering:
            assert "streams move to another pod" in comment.split(".")[0], directory.name
            assert PROFILE_ONLY not in comment, directory.name
        else:
            assert comment.startswith(PROFILE_ONLY), directory.name
    guide = (KUBERNETES_DIR.parents[1] / "docs" / "deploy.md").read_text()
    first = re.search(r"kubectl apply -k deploy/kubernetes/overlays/([\w-]+)", guide)
    assert first is not None, "docs/deploy.md applies no overlay"
    assert first[1] in registering, first[1]
