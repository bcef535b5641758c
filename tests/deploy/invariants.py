"""What must hold in every rendered variant, one check per invariant.

Each check raises AssertionError naming what is wrong. They are plain functions over a
``Rendered`` so that the tests can also feed them a deliberately broken manifest and see
them fail (a check that cannot fail checks nothing).
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from continuation_proxy.cli import parse_args as parse_proxy_args
from coordinator.router_settings import NEEDS_WORKER_URL, parse_router
from coordinator.service import posture
from coordinator.settings import ENV_PREFIX, Settings
from tests.deploy.rendering import COORDINATOR, DRAIN_HOOK, REPO, Rendered

HOOK_SCRIPT = DRAIN_HOOK.name
DRAINABLE_SERVER = "/opt/shutdown-coordinator/engine/drainable_server.py"
"""Where the recipe's ``drainable`` target puts an engine's drainable server."""
RECIPE = REPO / "deploy" / "container" / "Dockerfile"
PROXY = "continuation-proxy"
KUBELET_EXTENSION_S = 2
"""The kubelet's one-off extension when a preStop hook outlives the grace period."""
MIN_SAFETY_MARGIN_S = 5
"""Below this the hook's return, SIGTERM delivery and the containers' exit do not fit."""
TIER_TIMEOUT_S = 10.0
CONFIRM_S = 2.0


def _seconds(rendered: Rendered, key: str) -> float:
    return float(rendered.settings[f"SHUTDOWN_COORDINATOR_{key}"])


def check_budget(r: Rendered) -> None:
    """The coordinator is told the pod's grace period, and its budget fits inside it."""
    grace = int(r.pod["terminationGracePeriodSeconds"])
    told = _seconds(r, "GRACE_PERIOD_S")
    assert told == grace, f"coordinator told grace {told}s, pod has {grace}s"
    margin = _seconds(r, "SAFETY_MARGIN_S")
    assert MIN_SAFETY_MARGIN_S <= margin < grace, f"safety margin {margin}s vs grace {grace}s"
    budget = grace - margin
    min_drain = _seconds(r, "MIN_DRAIN_S")
    # The kill needs at least one full tier and SIGKILL's confirmation; the rest is for
    # draining, which must cover --min-drain.
    assert budget - (TIER_TIMEOUT_S + CONFIRM_S) >= min_drain, (
        f"budget {budget}s cannot hold min-drain {min_drain}s and one kill tier"
    )


def check_port(r: Rendered) -> None:
    """Every probe, hook, annotation and Service port names the coordinator's one port."""
    port = r.port
    assert r.settings["SHUTDOWN_COORDINATOR_HOST"] == "0.0.0.0", (
        "the kubelet reaches probes and httpGet hooks through the pod IP, not loopback"
    )
    coordinator = r.coordinator
    ports = {p["name"]: p["containerPort"] for p in coordinator.get("ports") or []}
    assert ports.get("coordinator") == port, f"containerPort {ports} vs {port}"
    for probe in ("livenessProbe", "startupProbe"):
        if probe in coordinator:
            assert coordinator[probe]["httpGet"]["port"] == port, f"coordinator {probe}"
    assert r.engine["readinessProbe"]["httpGet"]["port"] == port, "engine readiness port"
    service = r.named("Service", "inference-engine-coordinator")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert service_ports["coordinator"]["port"] == port
    assert service_ports["coordinator"]["targetPort"] in (port, "coordinator")


def check_prestop_targets_drain(r: Rendered) -> None:
    """The engine's preStop drains through this pod's coordinator, with the token."""
    pre_stop = r.engine["lifecycle"]["preStop"]
    assert len(pre_stop) == 1, f"one preStop handler, got {sorted(pre_stop)}"
    if "httpGet" in pre_stop:
        _check_httpget_hook(r, pre_stop["httpGet"])
    else:
        _check_exec_hook(r, r.engine, pre_stop["exec"]["command"])


def _token_path(r: Rendered, container: dict[str, Any], env_name: str) -> str:
    env = r.env(container)
    if env_name in env:
        return str(env[env_name]["value"])
    return r.settings[env_name]


def _check_exec_hook(r: Rendered, container: dict[str, Any], command: list[str]) -> None:
    assert command[0] in ("python3", "python"), f"hook runs {command}"
    script = command[1]
    assert script.endswith("/" + HOOK_SCRIPT), f"hook runs {command}"
    volume = r.volume_at(container, script)
    assert volume is not None, f"{script} is not mounted"
    assert "configMap" in volume, f"{script} is not mounted"
    hook_config = r.named("ConfigMap", volume["configMap"]["name"])
    assert hook_config["data"][HOOK_SCRIPT] == DRAIN_HOOK.read_text(), "stale hook script"
    env = r.env(container)
    url = env["SHUTDOWN_COORDINATOR_URL"]["value"]
    assert url == "http://127.0.0.1:$(SHUTDOWN_COORDINATOR_PORT)", f"hook URL {url}"
    port_env = [n for n, _ in env.items() if n == "SHUTDOWN_COORDINATOR_PORT"]
    names = list(env)
    if port_env:
        # $(VAR) only expands variables defined before it.
        assert names.index("SHUTDOWN_COORDINATOR_PORT") < names.index("SHUTDOWN_COORDINATOR_URL")
        ref = env["SHUTDOWN_COORDINATOR_PORT"]["valueFrom"]["configMapKeyRef"]
        assert r.named("ConfigMap", ref["name"])["data"][ref["key"]] == str(r.port)
    else:
        assert container["name"] == COORDINATOR, "only the coordinator gets the port via envFrom"
    token_file = _token_path(r, container, "SHUTDOWN_COORDINATOR_TOKEN_FILE")
    _check_token_file(r, container, token_file)


def _check_httpget_hook(r: Rendered, get: dict[str, Any]) -> None:
    assert get["path"] == "/drain", f"httpGet path {get['path']}"
    assert get["port"] == r.port, f"httpGet port {get['port']} vs {r.port}"
    assert get.get("scheme", "HTTP") == "HTTP"
    assert "host" not in get, "the hook must reach the pod's own coordinator (the pod IP)"
    headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
    volume = r.volume_at(r.coordinator, r.settings["SHUTDOWN_COORDINATOR_TOKEN_FILE"])
    assert volume is not None
    assert "secret" in volume
    token = r.secret_value(volume["secret"]["secretName"], "token")
    assert token, "the httpGet variant renders the token Secret it copies the header from"
    assert headers.get("Authorization") == f"Bearer {token}", "header does not carry the token"


def _check_token_file(r: Rendered, container: dict[str, Any], path: str) -> None:
    volume = r.volume_at(container, path)
    assert volume is not None, f"{path} is not a mounted Secret"
    assert "secret" in volume, f"{path} is not a mounted Secret"
    key = path.rsplit("/", 1)[1]
    items = volume["secret"].get("items")
    assert items is None or key in [i["path"] for i in items]
    assert volume["secret"]["secretName"].startswith("shutdown-coordinator-token")


def check_token_wiring(r: Rendered) -> None:
    """The coordinator and the engine (worker_client) read the same Secret."""
    coordinator_file = r.settings["SHUTDOWN_COORDINATOR_TOKEN_FILE"]
    _check_token_file(r, r.coordinator, coordinator_file)
    engine_file = r.env(r.engine)["SHUTDOWN_COORDINATOR_TOKEN_FILE"]["value"]
    _check_token_file(r, r.engine, engine_file)
    a = r.volume_at(r.coordinator, coordinator_file)
    b = r.volume_at(r.engine, engine_file)
    assert a is not None
    assert b is not None
    assert a["name"] == b["name"]


def check_sidecar(r: Rendered) -> None:
    """Native: an init container with restartPolicy Always. Classic: a container that joins
    the drain in its own preStop, so its SIGTERM waits for the drain too."""
    where = [key for key, c in r.containers() if c["name"] == COORDINATOR]
    if r.variant.native_sidecar:
        assert where == ["initContainers"], f"coordinator in {where}"
        assert r.coordinator.get("restartPolicy") == "Always", "not a native sidecar"
        assert r.pod["initContainers"][0]["name"] == COORDINATOR, "other init containers first"
        # A startup probe on a native sidecar holds the engine back by a probe period.
        assert "startupProbe" not in r.coordinator, "the engine would wait for a probe"
        assert r.coordinator["livenessProbe"]["httpGet"]["path"] == "/healthz"
    else:
        assert where == ["containers"], f"coordinator in {where}"
        assert "restartPolicy" not in r.coordinator
        _check_exec_hook(r, r.coordinator, r.coordinator["lifecycle"]["preStop"]["exec"]["command"])


def check_process_namespace(r: Rendered) -> None:
    """The coordinator sees (and may signal) the engine's processes."""
    assert r.pod.get("shareProcessNamespace") is True


def check_probes(r: Rendered) -> None:
    """Engine readiness is the coordinator's /readyz; coordinator liveness is /healthz."""
    ready = r.engine["readinessProbe"]["httpGet"]
    assert ready["path"] == "/readyz", f"engine readiness {ready}"
    assert r.coordinator["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The engine's own health must not decide readiness, or a draining pod could turn Ready.
    assert r.engine["startupProbe"]["httpGet"]["port"] == "http"
    assert "readinessProbe" not in r.coordinator, "one readiness signal: the engine's"


def check_security_context(r: Rendered) -> None:
    """Coordinator: read-only root, no escalation, every capability dropped but at most
    CAP_KILL, non-root as the engine's UID unless the engine itself runs as root."""
    c = r.coordinator
    assert r.effective(c, "readOnlyRootFilesystem") is True
    assert r.effective(c, "allowPrivilegeEscalation") is False
    caps = r.effective(c, "capabilities") or {}
    assert [x.upper() for x in caps.get("drop") or []] == ["ALL"], f"drop {caps}"
    added = {x.upper() for x in caps.get("add") or []}
    assert added <= {"KILL"}, f"capabilities beyond CAP_KILL: {added}"
    seccomp = r.effective(c, "seccompProfile") or {}
    assert seccomp.get("type") == "RuntimeDefault"
    uid = r.effective(c, "runAsUser")
    engine_uid = r.effective(r.engine, "runAsUser")
    if uid == 0:
        assert engine_uid == 0, "a root coordinator is only for an engine that runs as root"
        assert r.effective(c, "runAsNonRoot") is not True
    else:
        assert r.effective(c, "runAsNonRoot") is True
        assert uid == engine_uid, f"coordinator UID {uid} cannot signal engine UID {engine_uid}"
        # Kubernetes gives a non-root container no usable capability (no ambient set).
        assert not added, "CAP_KILL is useless to a non-root coordinator"


def check_writable_paths(r: Rendered) -> None:
    """With a read-only root, the state file and /tmp live on emptyDirs."""
    state = r.settings["SHUTDOWN_COORDINATOR_STATE_FILE"]
    volume = r.volume_at(r.coordinator, state)
    assert volume is not None, f"{state} not on an emptyDir"
    assert "emptyDir" in volume, f"{state} not on an emptyDir"
    # An emptyDir's root is mode 2777: a state file there would be refused (another user
    # could replace it), so it sits in a directory the coordinator makes (0700).
    mounts = {m["mountPath"].rstrip("/") for m in r.coordinator.get("volumeMounts") or []}
    assert str(Path(state).parent) not in mounts, f"{state} lies in an emptyDir's own root"
    tmp = r.volume_at(r.coordinator, "/tmp/x")
    assert tmp is not None
    assert "emptyDir" in tmp


def check_metrics(r: Rendered) -> None:
    """Scraped exactly one way: prometheus.io annotations or a ServiceMonitor."""
    annotations = r.deployment["spec"]["template"]["metadata"].get("annotations") or {}
    monitors = r.of_kind("ServiceMonitor")
    if "servicemonitor" in r.variant.components:
        assert len(monitors) == 1
        assert "prometheus.io/scrape" not in annotations
        monitor = monitors[0]["spec"]
        service = r.named("Service", "inference-engine-coordinator")
        labels = service["metadata"]["labels"]
        for key, value in monitor["selector"]["matchLabels"].items():
            assert labels.get(key) == value, f"ServiceMonitor selects {key}={value}"
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["endpoints"]:
            assert endpoint["port"] in port_names
            assert endpoint["path"] == "/metrics"
    else:
        assert not monitors
        assert annotations.get("prometheus.io/scrape") == "true"
        assert annotations.get("prometheus.io/port") == str(r.port)
        assert annotations.get("prometheus.io/path") == "/metrics"


def check_coordinator_service(r: Rendered) -> None:
    """Routers find every coordinator, draining ones included."""
    service = r.named("Service", "inference-engine-coordinator")["spec"]
    assert service.get("clusterIP") == "None"
    assert service.get("publishNotReadyAddresses") is True
    labels = r.deployment["spec"]["template"]["metadata"]["labels"]
    for key, value in service["selector"].items():
        assert labels.get(key) == value


def effective_settings(r: Rendered) -> Settings:
    """The settings ``serve`` runs with for this variant (its engine profile applied)."""
    fields = {name[len(ENV_PREFIX):].lower(): value for name, value in r.settings.items()}
    fields.pop("token_file", None)  # read by the posture check only
    return Settings(**fields)


def check_adoption(r: Rendered) -> None:
    """A stock engine is adopted: the adoption patterns in effect (the profile's, or the
    overlay's own) match the engine's command line and never the hook or the coordinator. An
    engine that registers (a migrating overlay's drainable server) is adopted by nothing: it
    runs the drainable server where the recipe's ``drainable`` target puts it, and no pattern
    could make the coordinator drain it twice."""
    raw = effective_settings(r).adopt_patterns
    engine = shlex.join([*(r.engine.get("command") or []), *(r.engine.get("args") or [])])
    if r.variant.registers:
        assert not raw, f"a registering engine is adopted too: {raw!r}"
        assert (r.engine.get("command") or [])[1:2] == [DRAINABLE_SERVER], engine
        assert DRAINABLE_SERVER in RECIPE.read_text(), "the recipe puts no drainable server there"
        return
    assert raw, "an unmodified engine is drained only if it is adopted"
    patterns = [re.compile(p) for p in raw]
    never = [
        shlex.join(r.engine["lifecycle"]["preStop"].get("exec", {}).get("command") or []),
        shlex.join(["python3", "/opt/shutdown-coordinator/hook/" + HOOK_SCRIPT]),
        shlex.join(["/usr/local/bin/shutdown-coordinator", *r.coordinator.get("args", [])]),
    ]
    assert any(p.search(engine) for p in patterns), f"{raw!r} misses {engine!r}"
    for line in never:
        if line:
            assert not any(p.search(line) for p in patterns), f"{raw!r} matches {line!r}"


def check_engine_profile(r: Rendered) -> None:
    """A stock engine's overlay names its engine's profile, so the adopted tree is stopped in
    the order that engine needs (its tiers) and its in-flight requests are waited for. A
    registering engine declares its tiers itself: no profile, whose patterns and gauges would
    only adopt it twice and wait on streams it hands back."""
    settings = effective_settings(r)
    if r.variant.registers:
        assert settings.engine == "generic", settings.engine
        assert not settings.adopt_tiers, settings.adopt_tiers
        return
    assert settings.engine != "generic", "no engine profile: children-first order"
    assert settings.adopt_tiers, f"profile {settings.engine} gives no tiers"


def proxy_container(r: Rendered) -> dict[str, Any] | None:
    """The continuation proxy's container, when the variant deploys it."""
    found = [d for d in r.of_kind("Deployment") if d["metadata"]["name"] == PROXY]
    if not found:
        return None
    container: dict[str, Any] = found[0]["spec"]["template"]["spec"]["containers"][0]
    return container


def check_continuation(r: Rendered) -> None:
    """A migrating overlay hands streams back, so something must continue them: a router
    adapter takes the pod out at the drain's start, and the continuation proxy deployed with
    it calls that same router (``--upstream`` is the adapter's URL) and acknowledges
    handoffs to the pods' coordinators (the base's headless Service, on the coordinators'
    port); its arguments parse with the proxy's own command line."""
    container = proxy_container(r)
    if not r.variant.registers and container is None:
        return
    assert container is not None, "handed-back streams have nothing to continue them"
    routers = [parse_router(text) for text in
               r.settings.get("SHUTDOWN_COORDINATOR_ROUTERS", "").split(",") if text]
    assert routers, "no router adapter: the draining pod stays in the router"
    args = parse_proxy_args(container["args"])
    assert args.upstream == routers[0].url, (args.upstream, routers[0].url)
    service = r.named("Service", "inference-engine-coordinator")
    assert service["spec"]["publishNotReadyAddresses"] is True
    (name, port), = args.coordinators_dns
    assert name.split(".")[0] == service["metadata"]["name"], name
    assert port == r.port, (port, r.port)


def check_secure_start(r: Rendered) -> None:
    """The sidecar's settings pass ``serve``'s secure-defaults check once the Secret's token
    file is in place: it listens beyond loopback, so it must have a token."""
    fields = {name[len(ENV_PREFIX):].lower(): value for name, value in r.settings.items()}
    with tempfile.TemporaryDirectory() as scratch:
        if "token_file" in fields:
            token = Path(scratch, "token")
            token.write_text("a-token\n")
            fields["token_file"] = str(token)
        try:
            posture.check(Settings(**fields))
        except posture.InsecureSettings as exc:
            raise AssertionError(f"serve would refuse these settings: {exc}") from exc


def check_router_worker_url(r: Rendered) -> None:
    """With a router that matches workers by URL (smg, vllm-router), the coordinator names
    this pod's engine as the router knows it: ``http://$(POD_IP):PORT``, the pod's IP from the
    downward API (defined before it, so the kubelet expands it) and the engine container's
    own ``http`` port; the settings with that address filled in pass ``serve``'s checks."""
    kinds = {parse_router(text).kind
             for text in r.settings.get("SHUTDOWN_COORDINATOR_ROUTERS", "").split(",") if text}
    if not kinds & NEEDS_WORKER_URL:
        return
    env = r.coordinator.get("env") or []
    names = [item["name"] for item in env]
    assert "SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL" in names, "the routers cannot find the engine"
    assert "POD_IP" in names[:names.index("SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL")], names
    assert r.env(r.coordinator)["POD_IP"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}}
    port = next(p["containerPort"] for p in r.engine["ports"] if p["name"] == "http")
    url = r.env(r.coordinator)["SHUTDOWN_COORDINATOR_ROUTER_WORKER_URL"]["value"]
    assert url == f"http://$(POD_IP):{port}", url
    fields = {name[len(ENV_PREFIX):].lower(): value for name, value in r.settings.items()}
    fields.pop("token_file", None)
    fields["router_worker_url"] = url.replace("$(POD_IP)", "10.0.0.5")
    Settings(**fields)


INSTANCE = "app.kubernetes.io/instance"


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def selectors(r: Rendered) -> list[tuple[str, dict[str, str]]]:
    """Every selector of the engine pods' objects in the render, named by where it is (the
    continuation proxy a migrating overlay deploys selects its own pods: one per router)."""
    found = [(f"Deployment {r.deployment['metadata']['name']}",
              r.deployment["spec"]["selector"]["matchLabels"])]
    found += [(f"Service {s['metadata']['name']}", s["spec"]["selector"])
              for s in r.of_kind("Service") if s["metadata"]["name"] != PROXY]
    found += [(f"PodDisruptionBudget {b['metadata']['name']}",
               b["spec"]["selector"]["matchLabels"]) for b in r.of_kind("PodDisruptionBudget")]
    for policy in r.of_kind("NetworkPolicy"):
        name = f"NetworkPolicy {policy['metadata']['name']}"
        found.append((name, policy["spec"]["podSelector"]["matchLabels"]))
        found += [(f"{name} ingress", peer["podSelector"]["matchLabels"])
                  for rule in policy["spec"].get("ingress") or []
                  for peer in rule.get("from") or []
                  if "podSelector" in peer and "namespaceSelector" not in peer]
    found += [(f"ServiceMonitor {m['metadata']['name']}", m["spec"]["selector"]["matchLabels"])
              for m in r.of_kind("ServiceMonitor")]
    return found


def check_instance_selectors(r: Rendered) -> None:
    """Every selector names the pods' own app.kubernetes.io/instance (the value kustomize
    renames with the engine Service's name: instance-label.yaml), so a second model under
    another namePrefix is never selected; and each selects what it is for in this render
    (the pods; for a ServiceMonitor, the coordinator Service)."""
    labels = r.deployment["spec"]["template"]["metadata"]["labels"]
    assert labels.get(INSTANCE), "the pods carry no instance label"
    monitored = r.named("Service", "inference-engine-coordinator")["metadata"]["labels"]
    for where, selector in selectors(r):
        assert selector.get(INSTANCE) == labels[INSTANCE], f"{where} selects {selector}"
        target = monitored if where.startswith("ServiceMonitor") else labels
        assert _selects(selector, target), f"{where} does not select its own: {selector}"


def check_disruption_budget(r: Rendered) -> None:
    """One PodDisruptionBudget for the pods: node drains and autoscalers evict them one at
    a time; maxUnavailable, never a minAvailable that would block a single replica's
    node from draining."""
    budgets = r.of_kind("PodDisruptionBudget")
    assert len(budgets) == 1, f"{len(budgets)} PodDisruptionBudgets"
    spec = budgets[0]["spec"]
    assert "minAvailable" not in spec, "minAvailable blocks the drain of a 1-replica node"
    assert spec.get("maxUnavailable") == 1, spec
    labels = r.deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(spec["selector"]["matchLabels"], labels)


def check_no_service_account_token(r: Rendered) -> None:
    """No API credentials in the pod: neither the coordinator nor the engine calls the API."""
    assert r.pod.get("automountServiceAccountToken") is False


def check_engine_requests(r: Rendered) -> None:
    """The engine asks the scheduler for CPU and memory (it loads its weights through host
    memory): placed where they fit, and not among the first pods evicted."""
    requests = (r.engine.get("resources") or {}).get("requests") or {}
    assert requests.get("cpu"), f"engine requests {requests}"
    assert requests.get("memory"), f"engine requests {requests}"


def check_pinned_images(r: Rendered) -> None:
    """Every image is pinned: a tag that is not `latest`, or a digest."""
    for _, container in r.containers():
        image = container["image"]
        if "@sha256:" in image:
            continue
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag, f"{container['name']} runs {image}, untagged"
        assert tag != "latest", f"{container['name']} runs {image}"


CHECKS: dict[str, Callable[[Rendered], None]] = {
    "budget": check_budget,
    "port": check_port,
    "prestop": check_prestop_targets_drain,
    "token": check_token_wiring,
    "sidecar": check_sidecar,
    "process-namespace": check_process_namespace,
    "probes": check_probes,
    "security-context": check_security_context,
    "writable-paths": check_writable_paths,
    "metrics": check_metrics,
    "coordinator-service": check_coordinator_service,
    "adoption": check_adoption,
    "engine-profile": check_engine_profile,
    "continuation": check_continuation,
    "secure-start": check_secure_start,
    "router-worker-url": check_router_worker_url,
    "instance-selectors": check_instance_selectors,
    "disruption-budget": check_disruption_budget,
    "service-account-token": check_no_service_account_token,
    "engine-requests": check_engine_requests,
    "pinned-images": check_pinned_images,
}
