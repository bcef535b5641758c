"""The LeaderWorkerSet overlay (deploy/kubernetes/lws) renders, validates, keeps every pod's
drain wiring in both templates, and tells each pod's coordinator its place in the group.

The group's pods are made here the way LWS makes them (kubernetes-sigs/lws at 060ab4da):
the leader from the leader template as ``<lws>-<group>`` with label ``worker-index: "0"``
(pkg/controllers/leaderworkerset_controller.go, constructLeaderStatefulSetApplyConfiguration),
workers from the worker template as ``<lws>-<group>-<index>`` (pod_controller.go,
constructWorkerStatefulSetApplyConfiguration; the worker-index label from the pod webhook,
pkg/webhooks/pod_webhook.go), the subdomain their StatefulSet's service name, and the
variables the pod webhook puts first in every container and init container
(pkg/utils/pod/pod_utils.go, AddLWSVariables). The kubelet's part follows: ``envFrom``, then
``env`` in order, each ``$(VAR)`` expanded from what is defined before it, then the command.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from typing import Any
from unittest import mock

import jsonschema
import kubernetes_validate
import pytest

from coordinator.drain import budget
from coordinator.group.budget import group_budget
from coordinator.group.membership import Membership, membership
from coordinator.settings import ENV_PREFIX, Settings
from tests.deploy import crd_schemas
from tests.deploy.invariants import CHECKS
from tests.deploy.rendering import (
    COORDINATOR,
    ENGINE,
    NATIVE_SIDECAR_VERSIONS,
    REPO,
    Rendered,
    Variant,
    kubectl,
    kustomize,
    stage,
)

# The per-variant breakages, shared with the Deployment overlays' tests.
from tests.deploy.test_kubernetes_manifests import _broken

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl is not installed: cannot run `kubectl kustomize`"
)

SHIPPED = Variant("lws", "sglang", shipped=True)
OWN = Variant("lws-own", "sglang", ("servicemonitor", "token-secret", "prestop-httpget"))
"""A user's own overlay from the same pieces: optional components, a group of 4."""
ROLES = ("leader", "worker")
NAMESPACE = "inference"
DIST_INIT_PORT = 20000
SET_NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
SIZE = "leaderworkerset.sigs.k8s.io/size"
LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
PER_POD_SETTINGS = ("GROUP_LEADER", "GROUP_SIZE", "GROUP_INDEX")
"""Group settings that differ between the pods: never in the ConfigMap they all load."""
NOT_APPLICABLE = {"router-worker-url", "instance-selectors"}
"""Checks with nothing to hold here: no router component in the overlay; and the
LeaderWorkerSet has no selector of its own, its Services' are the group's
(tests/deploy/test_platform_manifests.py holds them under two namePrefixes)."""
Docs = list[dict[str, Any]]


def own_kustomization(variant: Variant, size: int) -> str:
    """An overlay of one's own: the base, the engine, its multi-node command, optional
    components, the budget, the LeaderWorkerSet last; the size as a patch."""
    components = ["../../engines/sglang", "../../lws/sglang-multinode"]
    components += [f"../../components/{name}" for name in variant.components]
    components += ["../../components/budget", "../../lws/leaderworkerset"]
    return "\n".join([
        "resources:", "  - ../../base", "components:", *(f"  - {c}" for c in components),
        "patches:", "  - target: {kind: LeaderWorkerSet}", "    patch: |-",
        "      - op: add", "        path: /spec/leaderWorkerTemplate/size",
        f"        value: {size}", ""])


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Docs]:
    root = stage(tmp_path_factory.mktemp("deploy"))
    own = root / "variants" / OWN.name
    own.mkdir(parents=True)
    (own / "kustomization.yaml").write_text(own_kustomization(OWN, 4))
    return {SHIPPED.name: kustomize(root / "lws"), OWN.name: kustomize(own)}


@pytest.fixture(scope="module")
def docs(renders: dict[str, Docs]) -> Docs:
    return renders[SHIPPED.name]


@pytest.fixture(scope="module")
def docs_size_4(renders: dict[str, Docs]) -> Docs:
    return renders[OWN.name]


def _lws(docs: Docs) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert len(found) == 1, "expected one LeaderWorkerSet"
    return found[0]


def _template(docs: Docs, role: str) -> dict[str, Any]:
    shape = _lws(docs)["spec"]["leaderWorkerTemplate"]
    found: dict[str, Any] = shape.get(f"{role}Template") or shape["workerTemplate"]
    return found


def as_deployment(docs: Docs, role: str, variant: Variant = SHIPPED) -> Rendered:
    """One template as the invariants read a pod: the rendering with a Deployment of it in
    place of the LeaderWorkerSet (the same objects, so a change to either is seen by both)."""
    lws = _lws(docs)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": f"{lws['metadata']['name']}-{role}"},
                  "spec": {"template": _template(docs, role)}}
    return Rendered(variant, [*(d for d in docs if d is not lws), deployment])


def _config_maps(docs: Docs) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}


# --- the group as LWS and the kubelet make it ------------------------------------------------

def group_pods(docs: Docs, group: int = 0) -> list[dict[str, Any]]:
    """The pods of one group, index 0 (the leader) first, as LWS creates them."""
    lws = _lws(docs)
    name, spec = lws["metadata"]["name"], lws["spec"]
    size = int(spec["leaderWorkerTemplate"].get("size", 1))
    policy = (spec.get("networkConfig") or {}).get("subdomainPolicy", "Shared")
    leader = f"{name}-{group}"
    pods = []
    for index in range(size):
        template = copy.deepcopy(_template(docs, "leader" if index == 0 else "worker"))
        pod_name = leader if index == 0 else f"{leader}-{index}"
        labels = {**template["metadata"].get("labels", {}), SET_NAME: name,
                  GROUP_INDEX: str(group), WORKER_INDEX: str(index)}
        annotations = {**template["metadata"].get("annotations", {}), SIZE: str(size)}
        if index:
            annotations[LEADER_NAME] = leader
        pod_spec = template["spec"]
        pod_spec["hostname"] = pod_name
        pod_spec["subdomain"] = leader if policy == "UniquePerReplica" else name
        injected = [
            {"name": "LWS_LEADER_ADDRESS",
             "value": f"{leader}.{pod_spec['subdomain']}.{NAMESPACE}"},
            {"name": "LWS_GROUP_SIZE", "value": str(size)},
            {"name": "LWS_WORKER_INDEX", "value": str(index)},
        ]
        for key in ("containers", "initContainers"):
            for container in pod_spec.get(key) or []:
                names = {item["name"] for item in injected}
                own = [item for item in container.get("env") or [] if item["name"] not in names]
                container["env"] = [*injected, *own]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": pod_name, "namespace": NAMESPACE, "labels": labels,
                                  "annotations": annotations},
                     "spec": pod_spec})
    return pods


def pod_ip(pod: dict[str, Any]) -> str:
    return f"10.0.0.{10 + int(pod['metadata']['labels'][WORKER_INDEX])}"


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)``: defined names are replaced, ``$$`` is ``$``, others stay."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REFERENCE.sub(one, text)


def container_env(pod: dict[str, Any], name: str, config_maps: dict[str, dict[str, str]]
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """A container of ``pod`` and the environment the kubelet starts it with."""
    spec = pod["spec"]
    container = next(c for key in ("initContainers", "containers")
                     for c in spec.get(key) or [] if c["name"] == name)
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(config_maps[source["configMapRef"]["name"]])
    fields = {"status.podIP": pod_ip(pod), "metadata.name": pod["metadata"]["name"],
              "metadata.namespace": NAMESPACE}
    for key in ("labels", "annotations"):
        fields.update({f"metadata.{key}['{k}']": v for k, v in pod["metadata"][key].items()})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = config_maps[ref["name"]][ref["key"]]
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return container, env


def coordinator_membership(docs: Docs, pod: dict[str, Any]) -> Membership | None:
    """What the pod's coordinator makes of its environment, as ``serve`` reads it: its
    settings from the ``SHUTDOWN_COORDINATOR_*`` variables, its group from those and LWS's."""
    _, env = container_env(pod, COORDINATOR, _config_maps(docs))
    with mock.patch.dict(os.environ, env, clear=True):
        return membership(Settings(), os.environ)


def engine_argv(docs: Docs, pod: dict[str, Any]) -> list[str]:
    container, env = container_env(pod, ENGINE, _config_maps(docs))
    return [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]


# --- what must hold of the group --------------------------------------------------------------

def check_one_grace_period(docs: Docs) -> None:
    """Leader and workers have one terminationGracePeriodSeconds, the coordinators' budget."""
    graces = {role: _template(docs, role)["spec"]["terminationGracePeriodSeconds"]
              for role in ROLES}
    assert len(set(graces.values())) == 1, f"grace periods differ: {graces}"
    told = as_deployment(docs, "leader").settings["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"]
    assert float(told) == graces["leader"], f"coordinators told {told}s, pods have {graces}"


def check_members_resolve(docs: Docs) -> None:
    """Each pod's coordinator finds its place: the leader index 0 with no leader to follow,
    follower i index i following the leader's coordinator at the leader pod's DNS name on the
    port the leader's coordinator listens on."""
    pods = group_pods(docs)
    leader = pods[0]
    address = f"{leader['spec']['hostname']}.{leader['spec']['subdomain']}.{NAMESPACE}"
    port = next(p["containerPort"] for p in as_deployment(docs, "leader").coordinator["ports"]
                if p["name"] == "coordinator")
    config = as_deployment(docs, "leader").settings
    for name in PER_POD_SETTINGS:
        assert ENV_PREFIX + name not in config, f"{name} in the ConfigMap every pod loads"
    for index, pod in enumerate(pods):
        found = coordinator_membership(docs, pod)
        assert found is not None, f"pod {index}: its coordinator sees no group"
        assert (found.index, found.size) == (index, len(pods)), f"pod {index}: {found}"
        assert found.is_leader == (index == 0)
        assert found.leader_url == ("" if index == 0 else f"http://{address}:{port}"), found
        assert found.own_url == f"http://{pod_ip(pod)}:{port}", found


def check_engine_ranks(docs: Docs) -> None:
    """The engine of pod i is rank i of len(group) and meets at the leader the coordinators
    follow: the same LWS variables give both their place."""
    pods = group_pods(docs)
    for index, pod in enumerate(pods):
        argv = engine_argv(docs, pod)
        assert not [a for a in argv if "$(" in a], f"unexpanded: {argv}"
        found = coordinator_membership(docs, pod)
        assert found is not None
        _, leader_env = container_env(pods[0], ENGINE, _config_maps(docs))
        leader_host = leader_env["LWS_LEADER_ADDRESS"]
        expected = {f"--nnodes={len(pods)}", f"--node-rank={found.index}",
                    f"--dist-init-addr={leader_host}:{DIST_INIT_PORT}"}
        assert expected <= set(argv), f"pod {index}: {argv}"
        if found.leader_url:
            assert found.leader_url.split("//")[1].rsplit(":", 1)[0] == leader_host


def check_leader_dns(docs: Docs) -> None:
    """LWS names its headless Service after the set and creates it only if no Service has
    that name (pkg/utils/controller/controller_utils.go): the overlay's own may not."""
    name = _lws(docs)["metadata"]["name"]
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert name not in services, f"Service {name} would stand in for LWS's headless one"


def check_policies(docs: Docs) -> None:
    """Workers start with the leader (a leader waiting to be Ready waits for its ranks
    forever); a lost pod or restarted container recreates the group (its collective is
    broken); a rollout adds a group before it deletes one."""
    spec = _lws(docs)["spec"]
    assert spec.get("startupPolicy") == "LeaderCreated", spec.get("startupPolicy")
    restart = spec["leaderWorkerTemplate"].get("restartPolicy", "RecreateGroupOnPodRestart")
    assert restart in ("RecreateGroupOnPodRestart", "RecreateGroupAfterStart"), restart
    rolling = spec["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert rolling["maxUnavailable"] == 0, rolling
    assert rolling["maxSurge"] >= 1, rolling


def check_services(docs: Docs) -> None:
    """Requests go to the leaders only (rank 0 serves HTTP); the coordinator Service lists
    every pod's coordinator (routers, Prometheus, the group's summary on each)."""
    services = {d["metadata"]["name"]: d["spec"]["selector"]
                for d in docs if d["kind"] == "Service"}
    for pod in group_pods(docs):
        labels = pod["metadata"]["labels"]
        chosen = {n for n, sel in services.items() if sel.items() <= labels.items()}
        leader = labels[WORKER_INDEX] == "0"
        want = {"inference-engine-coordinator"} | ({"inference-engine"} if leader else set())
        assert chosen == want, f"{pod['metadata']['name']} is selected by {sorted(chosen)}"


def check_no_deployment(docs: Docs) -> None:
    """The pod lives in the LeaderWorkerSet only."""
    assert not [d for d in docs if d["kind"] == "Deployment"], "a Deployment is left over"


GROUP_CHECKS: dict[str, Callable[[Docs], None]] = {
    "one-grace-period": check_one_grace_period,
    "members-resolve": check_members_resolve,
    "engine-ranks": check_engine_ranks,
    "leader-dns": check_leader_dns,
    "policies": check_policies,
    "services": check_services,
    "no-deployment": check_no_deployment,
}


def _group_broken(docs: Docs, check: str) -> Docs:
    broken = copy.deepcopy(docs)
    lws = _lws(broken)
    shape = lws["spec"]["leaderWorkerTemplate"]
    worker = shape["workerTemplate"]["spec"]
    if check == "one-grace-period":
        worker["terminationGracePeriodSeconds"] += 30
    elif check == "members-resolve":
        # A setting wins over LWS's variable: every worker would call itself the leader.
        coordinator = next(c for c in worker["initContainers"] if c["name"] == COORDINATOR)
        coordinator["env"].append({"name": ENV_PREFIX + "GROUP_INDEX", "value": "0"})
    elif check == "engine-ranks":
        engine = next(c for c in worker["containers"] if c["name"] == ENGINE)
        engine["args"] = [a for a in engine["args"] if not a.startswith("--node-rank")]
    elif check == "leader-dns":
        lws["metadata"]["name"] = "inference-engine"
    elif check == "policies":
        lws["spec"]["startupPolicy"] = "LeaderReady"
    elif check == "services":
        service = next(d for d in broken if d["metadata"]["name"] == "inference-engine")
        del service["spec"]["selector"]["app.kubernetes.io/component"]
    elif check == "no-deployment":
        broken.append({"kind": "Deployment", "metadata": {"name": "inference-engine"}})
    else:  # pragma: no cover - a new check needs its own breakage here
        raise AssertionError(f"no breakage for {check}")
    return broken


# --- tests ------------------------------------------------------------------------------------

def test_renders_a_leaderworkerset(docs: Docs, docs_size_4: Docs) -> None:
    """1. Render deploy/kubernetes/lws, and an overlay of one's own from its pieces, with
       kubectl kustomize.
    2. Expect the base's ConfigMaps, Services and disruption budget and one
       LeaderWorkerSet with both templates (and, in one's own, what its components add)."""
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "ConfigMap", "LeaderWorkerSet", "PodDisruptionBudget",
                     "Service", "Service"], kinds
    own = sorted(d["kind"] for d in docs_size_4)
    assert own == sorted([*kinds, "Secret", "ServiceMonitor"]), own
    for rendered in (docs, docs_size_4):
        shape = _lws(rendered)["spec"]["leaderWorkerTemplate"]
        assert {"leaderTemplate", "workerTemplate"} <= set(shape)


def test_custom_resources_fit_their_crd_schemas(docs: Docs, docs_size_4: Docs) -> None:
    """1. Validate the LeaderWorkerSet (and one's own ServiceMonitor) against the strict
       subset of its CRD's schema."""
    for doc in [*docs, *docs_size_4]:
        if doc["kind"] in ("LeaderWorkerSet", "ServiceMonitor"):
            crd_schemas.validate(doc)


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "leaderWorkerTemplate", "sizes"), 2),
    (("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),
    (("spec", "startupPolicy"), "LeaderStarted"),
    (("spec", "rolloutStrategy", "rollingUpdateConfiguration", "maxSurge"), "150%"),
    (("spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers"), None),
    (("metadata", "name"), "Inference_Group"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_schema_rejects_what_lws_rejects(docs: Docs, path: tuple[str, ...], value: Any) -> None:
    """1. Change one field of the rendered LeaderWorkerSet (unknown, not in its enum, out of
       range, a required one removed, a name LWS's webhook refuses).
    2. Expect the schema to reject it."""
    lws = copy.deepcopy(_lws(docs))
    parent = lws
    for key in path[:-1]:
        parent = parent[key]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        crd_schemas.validate(lws)


@pytest.mark.parametrize("name", [SHIPPED.name, OWN.name])
@pytest.mark.parametrize("version", NATIVE_SIDECAR_VERSIONS)
def test_templates_and_pods_validate_against_every_supported_version(
        renders: dict[str, Docs], name: str, version: str) -> None:
    """1. Validate each template as a core PodTemplate, every built-in object as itself, and
       the pods LWS makes of them (its labels, annotations, variables, DNS names) as Pods,
       strictly, against the Kubernetes version."""
    docs = renders[name]
    for role in ROLES:
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": role}, "template": _template(docs, role)}
        kubernetes_validate.validate(template, version, strict=True)
    for doc in docs:
        if doc["kind"] not in ("LeaderWorkerSet", "ServiceMonitor"):
            kubernetes_validate.validate(doc, version, strict=True)
    for pod in group_pods(docs):
        kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize("variant", [SHIPPED, OWN], ids=lambda v: v.name)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("check", sorted(set(CHECKS) - NOT_APPLICABLE))
def test_template_keeps_invariant(
        renders: dict[str, Docs], variant: Variant, role: str, check: str) -> None:
    """1. Take the leader's or the workers' pod template.
    2. Run one of the overlays' invariants on it (tests/deploy/invariants.py)."""
    CHECKS[check](as_deployment(renders[variant.name], role, variant))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("check", sorted(set(CHECKS) - NOT_APPLICABLE))
def test_template_invariant_catches_its_breakage(docs: Docs, role: str, check: str) -> None:
    """1. Break one thing in the template, as the overlays' test does.
    2. Expect that invariant to fail on it."""
    rendered = as_deployment(docs, role)
    with pytest.raises(AssertionError):
        CHECKS[check](_broken(rendered, check))


@pytest.mark.parametrize("check", sorted(GROUP_CHECKS))
def test_group_keeps_invariant(docs: Docs, docs_size_4: Docs, check: str) -> None:
    """1. Run one group check on the overlay and on it with a group of 4 (a leader, 3
       followers)."""
    GROUP_CHECKS[check](docs)
    GROUP_CHECKS[check](docs_size_4)


@pytest.mark.parametrize("check", sorted(GROUP_CHECKS))
def test_group_invariant_catches_its_breakage(docs_size_4: Docs, check: str) -> None:
    """1. Break one thing in the group of 4.
    2. Expect that group check to fail on it."""
    with pytest.raises(AssertionError):
        GROUP_CHECKS[check](_group_broken(docs_size_4, check))


def test_followers_resolve_to_their_leader(docs_size_4: Docs) -> None:
    """1. Make the pods of a group of 4 as LWS does; start each coordinator's settings.
    2. Expect index 0 the leader, followers 1, 2, 3 each following the leader's coordinator
       at http://<lws>-0.<lws>.<namespace>:8787."""
    pods = group_pods(docs_size_4)
    found = [coordinator_membership(docs_size_4, pod) for pod in pods]
    assert [(m.index, m.size, m.is_leader) for m in found if m] == [
        (0, 4, True), (1, 4, False), (2, 4, False), (3, 4, False)]
    leader = "http://inference-engine-group-0.inference-engine-group.inference:8787"
    assert [m.leader_url for m in found if m] == ["", leader, leader, leader]


def test_documented_group_budget_matches_the_overlay(docs: Docs) -> None:
    """1. Take the overlay's grace period, safety margin and min-drain as rendered.
    2. Split the budget with the coordinator's own arithmetic: the followers' kill, the
       leader's drain (coordinator.group.budget), its migration and kill
       (coordinator.drain.budget), at the coordinator's defaults.
    3. docs/lws.md's budget table shows exactly those numbers."""
    settings = as_deployment(docs, "leader").settings
    with mock.patch.dict(os.environ, {}, clear=True):
        defaults = Settings()
    grace = float(settings["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"])
    margin = float(settings["SHUTDOWN_COORDINATOR_SAFETY_MARGIN_S"])
    group = group_budget(budget.total_budget(grace, margin), confirm_s=defaults.confirm_s,
                         follower_share=defaults.group_follower_share)
    leader = budget.split_budget(
        group.leader_s, tier_timeout_s=defaults.tier_timeout_s, confirm_s=defaults.confirm_s,
        min_drain_s=float(settings["SHUTDOWN_COORDINATOR_MIN_DRAIN_S"]))
    numbers = [grace, margin, group.total_s, group.follower_kill_s, group.leader_s,
               leader.migration_s, leader.termination_s, leader.min_drain_s]
    row = "| lws | " + " | ".join(f"{n:g}" for n in numbers) + " |"
    doc = (REPO / "docs" / "lws.md").read_text()
    assert row in doc.splitlines(), row
