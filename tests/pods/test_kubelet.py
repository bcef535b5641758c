"""The pod runner does what the kubelet does, shown on small pods whose containers record
what happens to them (``toy.py``: their own starts, signals and exits), the runtime's
records (``podman inspect``) and the kernel's (``exits``)."""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.pods.conftest import PodFactory, shared_directory
from tests.pods.exits import ProcessExits
from tests.pods.images import BASE, Images
from tests.pods.kubelet import MINIMUM_GRACE_S, Pod
from tests.pods.network import ClusterNetwork
from tests.pods.spec import POD_IP, CreateContainerConfigError, Objects
from tests.support.processes import wait_for

pytestmark = [pytest.mark.container, pytest.mark.timeout(600)]

TOY = Path(__file__).with_name("toy.py")
HTTP_PORT = 8080


@pytest.fixture(scope="module")
def base(images: Images) -> str:
    return images.base()


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return shared_directory(tmp_path / "records")


def toy(name: str, *args: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": BASE,
            "command": ["python3", "/toy/toy.py", name, "/records", *args],
            "volumeMounts": [{"name": "toy", "mountPath": "/toy", "readOnly": True},
                             {"name": "records", "mountPath": "/records"},
                             *fields.pop("volumeMounts", [])],
            **fields}


def sidecar(name: str, *args: str, **fields: Any) -> dict[str, Any]:
    return toy(name, *args, restartPolicy="Always", **fields)


def template(records: Path, containers: list[dict[str, Any]],
             init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    volumes = [{"name": "toy", "hostPath": {"path": str(TOY.parent)}},
               {"name": "records", "hostPath": {"path": str(records)}},
               *spec.pop("volumes", [])]
    return {"metadata": {"labels": {"app": "toy"}},
            "spec": {"shareProcessNamespace": True, "terminationGracePeriodSeconds": 10,
                     "initContainers": init or [], "containers": containers,
                     "volumes": volumes, **spec}}


def events(records: Path, name: str) -> list[dict[str, Any]]:
    path = records / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def first(records: Path, name: str, event: str) -> dict[str, Any]:
    found = [e for e in events(records, name) if e["event"] == event]
    assert found, f"{name} recorded no {event}: {events(records, name)}"
    return found[0]


def started(records: Path, *names: str) -> list[float]:
    """When each of ``names`` recorded its start, once all have (a container without a
    readiness probe is ready as soon as it runs, before its program wrote anything)."""
    wait_for(lambda: all(any(e["event"] == "start" for e in events(records, n)) for n in names),
             timeout=60, what=f"{names} started")
    return [first(records, n, "start")["at"] for n in names]


def test_sidecars_start_first_and_stop_after_the_main_containers_in_reverse_order(
        base: str, pods: PodFactory, records: Path) -> None:
    """1. A pod: two native sidecars, then a main container that takes a second to stop.
    2. Started: each sidecar before the next, the main container last.
    3. Deleted: the main container gets its SIGTERM first; the second sidecar only once the
       main container has exited, the first only once the second has; each exits 0 by its
       own record and by the runtime's; nothing needed SIGKILL."""
    pod = pods(template(records, [toy("main", "--on-term", "linger:1")],
                        init=[sidecar("first"), sidecar("second")]))
    pod.start(ready_timeout=120)
    starts = started(records, "first", "second", "main")
    assert starts == sorted(starts)

    deletion = pod.delete()
    order = ["main", "second", "first"]
    for earlier, later in itertools.pairwise(order):
        assert first(records, earlier, "exit")["at"] <= first(records, later, "signal")["at"]
    for name in order:
        assert first(records, name, "signal")["signal"] == "SIGTERM"
        assert first(records, name, "exit")["code"] == 0
        assert deletion.containers[name].exit_code == 0
        assert not deletion.containers[name].runtime_sigkill
    assert [e.container for e in pod.events_of("Killing")].count("main") == 1


def test_the_prestop_hook_runs_first_and_the_grace_left_ends_in_sigkill(
        base: str, pods: PodFactory, records: Path, process_exits: ProcessExits) -> None:
    """1. A main container that ignores SIGTERM, with an exec preStop hook that takes a few
       seconds, in a pod with a 5 s grace period.
    2. Deleted: the hook runs in the container and returns 0; only then does the main
       process get SIGTERM (its own record); the runtime is given the grace left, at least
       2 s, and SIGKILLs it when that runs out: exit 137 in the runtime's record, death by
       SIGKILL in the kernel's, and no FailedPreStopHook event."""
    hook = {"exec": {"command": ["python3", "-c", "import time; time.sleep(3)"]}}
    pod = pods(template(records, [toy("main", "--on-term", "ignore",
                                      lifecycle={"preStop": hook})],
                        terminationGracePeriodSeconds=5))
    pod.start(ready_timeout=120)
    main = pod.containers["main"]
    assert main.host_pid is not None
    host_pid, (since,) = main.host_pid, started(records, "main")

    deletion = pod.delete()
    ended = deletion.containers["main"]
    assert ended.hook is not None
    assert ended.hook.exit_code == 0, ended.hook
    assert ended.hook.ended_at is not None
    assert ended.hook.ended_at <= first(records, "main", "signal")["at"]
    assert ended.grace_given is not None
    assert MINIMUM_GRACE_S <= ended.grace_given <= 5 - 3
    assert ended.runtime_sigkill
    assert ended.exit_code == 137
    end = process_exits.wait_for({host_pid}, since, timeout=30)[host_pid]
    assert end.signal == signal.SIGKILL
    assert not pod.events_of("FailedPreStopHook")


def test_a_failed_hook_is_an_event_and_the_container_is_stopped_anyway(
        base: str, pods: PodFactory, records: Path) -> None:
    """1. An exec preStop hook that exits 3.
    2. Deleted: a ``FailedPreStopHook`` Warning event ("PreStopHook failed"), and the main
       container still gets its SIGTERM and exits 0."""
    hook = {"exec": {"command": ["python3", "-c", "raise SystemExit(3)"]}}
    pod = pods(template(records, [toy("main", lifecycle={"preStop": hook})]))
    pod.start(ready_timeout=120)
    started(records, "main")
    deletion = pod.delete()
    failed = pod.events_of("FailedPreStopHook")
    assert [(e.type, e.container, e.message) for e in failed] == [
        ("Warning", "main", "PreStopHook failed")]
    assert deletion.containers["main"].hook is not None
    assert deletion.containers["main"].hook.exit_code == 3
    assert first(records, "main", "signal")["signal"] == "SIGTERM"
    assert deletion.containers["main"].exit_code == 0


@pytest.mark.parametrize(("path", "port", "failed"), [
    pytest.param("/drain?status=500", HTTP_PORT, False, id="an HTTP 500 is no failure"),
    pytest.param("/drain", HTTP_PORT + 1, True, id="a refused connection is"),
])
def test_an_httpget_hook_is_a_get_from_the_node_to_the_pod_ip(
        base: str, pods: PodFactory, records: Path, path: str, port: int,
        failed: bool) -> None:
    """1. A main container serving HTTP on every address; an httpGet preStop hook with a
       header, to its port or to one nothing listens on.
    2. Deleted: the server saw the GET to the pod IP with the header (when it listens); the
       kubelet records a failure only when the request itself failed, not for its status;
       the container is stopped either way."""
    hook = {"httpGet": {"path": path, "port": port,
                        "httpHeaders": [{"name": "Authorization", "value": "Bearer t"}]}}
    pod = pods(template(records, [toy("main", "--serve", str(HTTP_PORT),
                                      lifecycle={"preStop": hook})]))
    pod.start(ready_timeout=120)
    started(records, "main")
    deletion = pod.delete()
    requests = [e for e in events(records, "main") if e["event"] == "request"]
    if failed:
        assert requests == []
        assert [e.container for e in pod.events_of("FailedPreStopHook")] == ["main"]
    else:
        assert [r["path"] for r in requests] == ["/drain"]
        assert requests[0]["headers"]["Authorization"] == "Bearer t"
        assert requests[0]["headers"]["Host"] == f"{POD_IP}:{HTTP_PORT}"
        assert not pod.events_of("FailedPreStopHook")
    assert deletion.containers["main"].exit_code == 0


def test_a_server_on_loopback_only_is_not_reached_at_the_pod_ip(
        base: str, pods: PodFactory, records: Path) -> None:
    """The pod IP is not loopback: a readiness probe to a port that only 127.0.0.1 listens
    on fails, as it would from a real node."""
    program = ("import http.server as h; h.HTTPServer(('127.0.0.1', 8080), "
               "h.SimpleHTTPRequestHandler).serve_forever()")
    probe = {"httpGet": {"path": "/", "port": HTTP_PORT}, "periodSeconds": 1,
             "failureThreshold": 1}
    pod = pods(template(records, [{"name": "main", "image": BASE,
                                   "command": ["python3", "-c", program],
                                   "readinessProbe": probe}]))
    with pytest.raises(AssertionError, match="not Ready"):
        pod.start(ready_timeout=8)
    pod.delete()


def test_the_spec_reaches_the_container(base: str, pods: PodFactory, records: Path) -> None:
    """1. A container with env from a ConfigMap, a Secret, the downward API, ``$(VAR)``
       expansion, Secret/ConfigMap/emptyDir/memory emptyDir volumes, a pod user, group and
       fsGroup, all capabilities dropped but one, no privilege escalation, a read-only root.
    2. What the container itself sees is what the kubelet would give it."""
    objects = Objects(config_maps={"settings": {"COLOR": "blue", "FILE": "cfg\n"}},
                      secrets={"token": {"token": "s3cret"}})
    container = toy(
        "main", "--facts", "$(GREETING)",
        envFrom=[{"configMapRef": {"name": "settings"}}],
        env=[{"name": "GREETING", "value": "hello-$(COLOR)"},
             {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
             {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
             {"name": "APP", "valueFrom": {"fieldRef": {
                 "fieldPath": "metadata.labels['app']"}}},
             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token",
                                                              "key": "token"}}},
             {"name": "MEMORY", "valueFrom": {"resourceFieldRef": {
                 "resource": "limits.memory", "divisor": "1Mi"}}}],
        resources={"limits": {"memory": "128Mi"}},
        securityContext={"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                         "capabilities": {"drop": ["ALL"], "add": ["KILL"]}},
        volumeMounts=[{"name": "config", "mountPath": "/etc/config", "readOnly": True},
                      {"name": "secret", "mountPath": "/etc/secret", "readOnly": True},
                      {"name": "data", "mountPath": "/data"},
                      {"name": "shm", "mountPath": "/dev/shm"}])
    spec = template(records, [container], securityContext={
        "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000, "runAsNonRoot": True},
        volumes=[{"name": "config", "configMap": {"name": "settings", "defaultMode": 0o444}},
                 {"name": "secret", "secret": {"secretName": "token", "defaultMode": 0o440}},
                 {"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                 {"name": "shm", "emptyDir": {}}])
    pod = pods(spec, objects)
    pod.start(ready_timeout=120)
    started(records, "main")
    facts = json.loads((records / "main-facts.json").read_text())
    pod.delete()

    env = facts["env"]
    assert env["COLOR"] == "blue"
    assert env["GREETING"] == "hello-blue"
    assert facts["argv"][-1] == "hello-blue"  # args expanded against the environment
    assert env["POD_NAME"] == pod.name == facts["hostname"]
    assert env["POD_IP"] == POD_IP
    assert env["APP"] == "toy"
    assert env["TOKEN"] == "s3cret"
    assert env["MEMORY"] == "128"
    assert (facts["uid"], facts["gid"]) == (1000, 1000)
    assert 2000 in facts["groups"]
    assert facts["cap_eff"] == "0000000000000000"  # non-root: no effective capability
    assert facts["no_new_privs"] == "1"
    assert facts["root_writable"] is False
    files = facts["files"]
    assert files["/etc/secret/token"] == {"mode": "440", "uid": 0, "gid": 2000}
    assert files["/etc/config/COLOR"]["mode"] == "444"
    assert files["/data"]["gid"] == 2000
    assert files["/data"]["mode"] == "2777"
    assert facts["mounts"]["/data"] == "tmpfs"
    assert facts["sizes"]["/data"] == 16 * 2**20


def test_a_root_image_under_run_as_non_root_is_refused(base: str, pods: PodFactory,
                                                       records: Path) -> None:
    """The base image runs as root: with ``runAsNonRoot`` and no ``runAsUser`` the container
    is not created (``CreateContainerConfigError``, a ``Failed`` event)."""
    pod = pods(template(records, [toy("main")], securityContext={"runAsNonRoot": True}))
    with pytest.raises(CreateContainerConfigError, match="will run as root"):
        pod.start(ready_timeout=60)
    assert [e.container for e in pod.events_of("Failed")] == ["main"]


def test_readiness_gates_the_pod(base: str, pods: PodFactory, records: Path) -> None:
    """1. A readiness probe on a path that answers 503 until a file appears.
    2. The pod is not Ready; once the file is there, it is, and the change is recorded."""
    probe = {"httpGet": {"path": "/ready", "port": HTTP_PORT}, "periodSeconds": 1,
             "failureThreshold": 1}
    pod: Pod = pods(template(records, [toy("main", "--serve", str(HTTP_PORT),
                                           readinessProbe=probe)]))
    with pytest.raises(AssertionError, match="not Ready"):
        pod.start(ready_timeout=5)
    (records / "main.ready").touch()
    pod.wait_ready(timeout=60)
    assert [ready for _, ready in pod.containers["main"].ready_changes][-1] is True
    pod.delete()


def test_pods_on_a_cluster_network_reach_each_other_and_the_node_by_their_own_ips(
        base: str, cluster_network: ClusterNetwork, pods: PodFactory, records: Path) -> None:
    """1. Two pods on one ``ClusterNetwork``, each serving HTTP on every address; the second
       names the first by a ``hostAliases`` name, and its readiness probe is an httpGet.
    2. Each pod has an address of its own on the network, which its downward API's
       ``status.podIP`` gives and where the kubelet's probe reached it (the server's record
       of the request's ``Host``).
    3. From inside the second pod, a GET to the first by its alias name reaches the first
       (its record); the node reaches each at its IP."""
    ip_env = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    probe = {"httpGet": {"path": "/ready-check", "port": HTTP_PORT}, "periodSeconds": 1}
    first_pod = pods(template(records, [toy("one", "--serve", str(HTTP_PORT), "--facts",
                                            env=[ip_env])]),
                     name="one", network=cluster_network)
    first_pod.start(ready_timeout=120)
    second_pod = pods(template(records, [toy("two", "--serve", str(HTTP_PORT), "--facts",
                                             env=[ip_env], readinessProbe=probe)],
                               hostAliases=[{"ip": first_pod.ip, "hostnames": ["peer"]}]),
                      name="two", network=cluster_network)
    second_pod.start(ready_timeout=120)
    started(records, "one", "two")
    assert len({first_pod.ip, second_pod.ip, cluster_network.node_ip}) == 3
    for name, pod in (("one", first_pod), ("two", second_pod)):
        facts = records / f"{name}-facts.json"
        wait_for(facts.exists, timeout=30, what=f"{name}'s facts")
        assert json.loads(facts.read_text())["env"]["POD_IP"] == pod.ip
    probed = [e for e in events(records, "two") if e["event"] == "request"]
    assert probed[0]["headers"]["Host"] == f"{second_pod.ip}:{HTTP_PORT}"

    fetch = ("import urllib.request as u; "
             f"print(u.urlopen('http://peer:{HTTP_PORT}/from-two', timeout=10).status)")
    done = second_pod.exec("two", "python3", "-c", fetch)
    assert (done.returncode, done.stdout.strip()) == (0, "200"), done.stderr
    assert [e["path"] for e in events(records, "one") if e["event"] == "request"] \
        == ["/from-two"]
    for pod in (first_pod, second_pod):
        assert httpx.get(f"http://{pod.ip}:{HTTP_PORT}/from-node", timeout=10).status_code \
            == 200
    first_pod.delete()
    second_pod.delete()
