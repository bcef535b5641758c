"""A pod started and deleted the way the kubelet does it, on podman.

Each step follows the kubelet's code (kubernetes/kubernetes at fbba6b47, files under
``pkg/kubelet/``); docs/deploy.md ("Pods on a real container runtime") lists what is not
reproduced.

Start (``Pod.start``; ``kuberuntime/kuberuntime_manager.go`` ``SyncPod``):

1. The sandbox: a podman pod sharing the network, IPC and UTS namespaces, and the PID
   namespace when ``shareProcessNamespace`` is set, whose infra container (podman's
   catatonit) is PID 1 as the pause container is (``createPodSandbox``). Its hostname is
   the pod's name; its ``/etc/hosts`` the kubelet's (``spec.hosts_file``: the pod's IP and
   name, its ``hostAliases``), mounted into every container; its IP
   (``POD_IP``) an address of its own loopback, or, on a ``network.ClusterNetwork``
   (several pods that reach each other), its ``eth0`` address there.
2. The volumes, made on the node before any container (``volumemanager``).
3. The init containers in order (``computeInitContainerActions``): a regular one must exit 0
   before the next starts; a native sidecar (``restartPolicy: Always``) counts as started
   once it runs and its ``postStart`` hook returned, or once its startup probe passed when
   it has one, and the next starts then, without waiting for its readiness.
4. The containers, one after the other in the spec's order, each created, started and its
   ``postStart`` hook run (``startContainer``: steps 2-4).
5. Probes for every running container (``probing``, after ``prober/worker.go``).

Delete (``Pod.delete``; ``kuberuntime_container.go`` ``killContainersWithSyncResult``,
``killContainer``, ``executePreStopHook``; ``kuberuntime_termination_order.go``):

1. Every running container is killed at once, each in a thread of its own, with the grace
   period ``T`` (``terminationGracePeriodSeconds``, or the deletion's own).
2. Its ``preStop`` hook runs first; the kubelet waits for it at most ``T`` seconds, then takes
   the whole seconds it waited off ``T``. A hook that fails is recorded as a
   ``FailedPreStopHook`` Warning event ("PreStopHook failed"), and nothing else changes.
3. A sidecar then waits for its turn: until every main container and every sidecar started
   after it has terminated, at most the grace left (whole seconds taken off again).
4. The grace left is raised to at least 2 s (``minimumGracePeriodInSeconds``) and the
   container is stopped by the runtime with it: ``podman stop -t <grace>`` sends the
   image's stop signal (SIGTERM) to the container's main process and SIGKILL when the grace
   runs out, as containerd's ``StopContainer`` does.
5. Once every container has stopped, the sandbox is stopped (``StopPodSandbox``) and the
   pod is gone.

What the runtime recorded (``podman inspect``: exit code, OOM kill, times) and each
container's log are kept before the pod is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.pods.handlers import HandlerResult, Node, handler_ports, resolve_port
from tests.pods.network import ClusterNetwork
from tests.pods.podman import Podman
from tests.pods.probing import Prober
from tests.pods.processes import PodProcess, pod_pid, pod_processes, running, start_ticks
from tests.pods.spec import (
    POD_IP,
    CreateContainerConfigError,
    Objects,
    PodMeta,
    Volume,
    hosts_file,
    make_volume,
    podman_create_args,
    unmount_volumes,
)
from tests.pods.state import Container, Deletion, Event

MINIMUM_GRACE_S = 2
"""``minimumGracePeriodInSeconds``: the least a container is given to stop."""
RELAY = Path(__file__).with_name("relay.py")
SIGKILL_WARNING = re.compile(r"failed to stop container .* resorting to SIGKILL")


class TerminationOrdering:
    """``terminationOrdering``: a sidecar's turn comes once every main container and every
    sidecar declared after it has terminated."""

    def __init__(self, spec: Mapping[str, Any], running: set[str]) -> None:
        self._done = {c["name"]: threading.Event() for c in
                      [*(spec.get("initContainers") or []), *spec["containers"]]}
        for name, done in self._done.items():
            if name not in running:
                done.set()
        mains = [self._done[c["name"]] for c in spec["containers"]]
        self._prereqs: dict[str, list[threading.Event]] = {}
        later: str | None = None
        for container in reversed(spec.get("initContainers") or []):
            if container.get("restartPolicy") == "Always":
                self._prereqs[container["name"]] = [
                    *mains, *([self._done[later]] if later else [])]
                later = container["name"]

    def wait_for_turn(self, name: str, grace_s: int) -> float:
        started = time.monotonic()
        deadline = started + grace_s
        for prereq in self._prereqs.get(name, ()):
            if not prereq.wait(max(0.0, deadline - time.monotonic())):
                break
        return time.monotonic() - started

    def terminated(self, name: str) -> None:
        self._done[name].set()


class Pod:
    """A pod from a rendered pod template, run on podman (see the module's docstring).

    ``close()`` always leaves nothing behind: it force-removes the pod (``podman pod rm -f``),
    stops the node-side helpers and unmounts the pod's volumes."""

    def __init__(self, podman: Podman, template: Mapping[str, Any], objects: Objects, *,
                 name: str, workdir: Path, spawn: Callable[..., subprocess.Popen[Any]],
                 extra_ports: Sequence[int] = (),
                 network: ClusterNetwork | None = None) -> None:
        self.podman = podman
        self.network = network
        self.spec: dict[str, Any] = dict(template["spec"])
        metadata = template.get("metadata") or {}
        self.name = f"{name}-{secrets.token_hex(3)}"
        self.meta = PodMeta(self.name, secrets.token_hex(16), metadata.get("labels") or {},
                            metadata.get("annotations") or {})
        self.objects = objects
        self.workdir = workdir
        self._spawn = spawn
        self.events: list[Event] = []
        self._events_lock = threading.Lock()
        self.containers: dict[str, Container] = {}
        for init, key in ((True, "initContainers"), (False, "containers")):
            for index, spec in enumerate(self.spec.get(key) or []):
                self.containers[spec["name"]] = Container(
                    dict(spec), init, index, f"{self.name}-{spec['name']}")
        self._relay_dir = Path(tempfile.mkdtemp(prefix="pod-relay-"))
        self.node = Node(self._relay_dir, self._exec_argv, self._spawn_exec)
        self._relay: subprocess.Popen[Any] | None = None
        self._ports = set(extra_ports)
        for container in self.containers.values():
            spec = container.spec
            self._ports |= {int(p["containerPort"]) for p in spec.get("ports") or []}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                self._ports |= handler_ports(spec.get(probe), spec)
            for hook in ("postStart", "preStop"):
                self._ports |= handler_ports((spec.get("lifecycle") or {}).get(hook), spec)
        self._probing = threading.Event()
        self._probers: list[threading.Thread] = []
        self.infra_pid: int | None = None
        self.deletion: Deletion | None = None
        self._late_hooks: list[tuple[Container, threading.Thread, list[HandlerResult]]] = []
        """Hooks that outlived the grace period the kubelet waited for them."""
        self._closed = False
        self._hosts = workdir / "etc-hosts"

    # Records.

    def record(self, type_: str, reason: str, container: str, message: str) -> None:
        with self._events_lock:
            self.events.append(Event(time.time(), type_, reason, container, message))

    def events_of(self, reason: str) -> list[Event]:
        with self._events_lock:
            return [e for e in self.events if e.reason == reason]

    @property
    def ip(self) -> str:
        """The pod's IP (``status.podIP``)."""
        return self.meta.ip

    @property
    def grace_period(self) -> int:
        return int(self.spec.get("terminationGracePeriodSeconds", 30))

    # Start.

    def start(self, *, ready_timeout: float = 600.0) -> None:
        """Steps 1-5 of the start (see the module's docstring); returns once the pod is
        Ready (every container ready), failing after ``ready_timeout``."""
        self._sandbox()
        volumes = self._volumes()
        for container in self.containers.values():
            if container.init:
                self._start_container(container, volumes)
                if container.sidecar:
                    self._wait_started(container, ready_timeout)
                else:
                    self._wait_exit_zero(container, ready_timeout)
        for container in self.containers.values():
            if not container.init:
                self._start_container(container, volumes)
        self.wait_ready(ready_timeout)

    def _sandbox(self) -> None:
        shared = ["ipc", "net", "uts"]
        if self.spec.get("shareProcessNamespace"):
            shared.append("pid")
        self.podman.run("pod", "create", "--name", self.name, "--hostname", self.name,
                        "--share", ",".join(shared), *self.podman.labels(self.name))
        self.podman.run("pod", "start", self.name)
        infra = self.podman.run("pod", "inspect", "--format", "{{.InfraContainerID}}",
                                self.name).stdout.strip()
        self.infra_pid = int(self.podman.inspect(infra)["State"]["Pid"])
        netns = f"--net=/proc/{self.infra_pid}/ns/net"
        if self.network is None:
            subprocess.run(["nsenter", netns, "ip", "addr", "add", f"{POD_IP}/32", "dev", "lo"],
                           check=True, timeout=30)
        else:
            ip = self.network.attach(self.infra_pid)
            self.meta = dataclasses.replace(self.meta, ip=ip, host_ip=self.network.node_ip)
            self.node.ip = ip
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._hosts.write_text(hosts_file(self.spec, self.meta))
        self._hosts.chmod(0o644)
        self._relay = self._spawn(
            ["nsenter", netns, "python3", str(RELAY), str(self._relay_dir), self.ip,
             *map(str, sorted(self._ports))], stdout=subprocess.PIPE, text=True)
        assert self._relay.stdout is not None
        line = self._relay.stdout.readline().strip()
        assert line == "ready", f"the pod's relay did not start: {line!r}"

    def _volumes(self) -> dict[str, Volume]:
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        where = self.workdir / "volumes"
        where.mkdir(parents=True, exist_ok=True)
        return {v["name"]: make_volume(v, where, self.objects, fs_group)
                for v in self.spec.get("volumes") or []}

    def _image_user(self, image: str) -> str:
        found = self.podman.json("image", "inspect", image)
        if not found:
            raise CreateContainerConfigError(f"image {image!r} is not present (ErrImageNeverPull)")
        return str((found[0].get("Config") or {}).get("User") or "")

    def _start_container(self, container: Container, volumes: Mapping[str, Volume]) -> None:
        spec = container.spec
        try:
            args = podman_create_args(self.spec, spec, meta=self.meta, objects=self.objects,
                                      volumes=volumes, image_user=self._image_user(spec["image"]),
                                      hosts_file=self._hosts)
        except CreateContainerConfigError as exc:
            self.record("Warning", "Failed", container.name, f"Error: {exc}")
            raise
        self.podman.run("create", "--pod", self.name, "--name", container.runtime_name,
                        *self.podman.labels(self.name), *args)
        self.record("Normal", "Created", container.name, f"Created container: {container.name}")
        self.podman.run("start", container.runtime_name)
        self.record("Normal", "Started", container.name, f"Started container {container.name}")
        state = self.podman.inspect(container.runtime_name)["State"]
        container.host_pid = int(state["Pid"]) or None
        if container.host_pid:
            container.pod_pid = pod_pid(container.host_pid)
            container.start_ticks = start_ticks(container.host_pid)
        post_start = (spec.get("lifecycle") or {}).get("postStart")
        if post_start:
            result = self.node.run(post_start, spec, container.runtime_name)
            if result.failed:
                self.record("Warning", "FailedPostStartHook", container.name,
                            "PostStartHook failed")
                self.podman.run("stop", "-t", str(self.grace_period), container.runtime_name)
                raise AssertionError(f"{container.name}: postStart failed: {result.error}")
        self._start_probing(container)

    def _wait_exit_zero(self, container: Container, timeout: float) -> None:
        done = self.podman.run("wait", container.runtime_name, timeout=timeout)
        code = int(done.stdout.strip() or -1)
        if code != 0:
            raise AssertionError(f"init container {container.name} exited {code}")

    def _wait_started(self, container: Container, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not container.started:
            if time.monotonic() > deadline:
                raise AssertionError(f"sidecar {container.name} not started in {timeout} s")
            self._probing.wait(0.05)

    # Probes.

    def _start_probing(self, container: Container) -> None:
        prober = Prober(container, self.node, self.record, self._probing)
        thread = threading.Thread(target=prober.run, daemon=True,
                                  name=f"prober-{container.name}")
        self._probers.append(thread)
        thread.start()

    def _running(self, container: Container) -> bool:
        return running(container.host_pid, container.start_ticks)

    def ready(self) -> bool:
        """The pod's Ready condition: every container (sidecars too) is ready."""
        return all(c.ready for c in self.containers.values() if not c.init or c.sidecar)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            for container in self.containers.values():
                # Started by the runtime, not only past its startup probe: a container that
                # dies while that probe still fails would otherwise be waited for in vain.
                if (not container.init or container.sidecar) and container.host_pid \
                        and not self._running(container):
                    raise AssertionError(f"container {container.name} exited before the pod "
                                         f"was Ready:\n{self.logs(container.name)[-3000:]}")
            if time.monotonic() > deadline:
                waiting = [c.name for c in self.containers.values() if not c.ready]
                raise AssertionError(f"pod not Ready after {timeout} s: {waiting}")
            self._probing.wait(0.25)

    # Into the pod.

    def client(self, port: int | str, container: str | None = None,
               **kwargs: Any) -> httpx.Client:
        """An HTTP client to the pod's ``ip:port`` (a named port of ``container``)."""
        if isinstance(port, str):
            assert container is not None
            port = resolve_port(port, self.containers[container].spec)
        return self.node.client(port, **kwargs)

    def _exec_argv(self, container: str, command: Sequence[str]) -> list[str]:
        return self.podman.argv("exec", container, *command)

    def _spawn_exec(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, env=self.podman.env, stdin=subprocess.DEVNULL, **kwargs)

    def exec(self, container: str, *command: str) -> subprocess.CompletedProcess[str]:
        return self.podman.run("exec", self.containers[container].runtime_name, *command,
                               check=False)

    def processes(self) -> list[PodProcess]:
        """Every process of the pod now (from ``/proc``): those in its PID namespace, and
        without ``shareProcessNamespace`` those in each running container's own (each
        ``pod_pid`` is then its PID in its container's namespace)."""
        assert self.infra_pid is not None
        found = {p.host_pid: p for p in pod_processes(self.infra_pid)}
        if not self.spec.get("shareProcessNamespace"):
            for container in self.containers.values():
                if container.host_pid is not None and self._running(container):
                    found.update((p.host_pid, p) for p in pod_processes(container.host_pid))
        return list(found.values())

    def logs(self, container: str) -> str:
        found = self.containers[container]
        if found.log:
            return found.log
        done = self.podman.run("logs", found.runtime_name, check=False)
        return done.stdout + done.stderr

    # Delete.

    def delete(self, grace_period: int | None = None) -> Deletion:
        """Steps 1-5 of the deletion (see the module's docstring)."""
        grace = self.grace_period if grace_period is None else grace_period
        deletion = Deletion(grace, time.time())
        self.deletion = deletion
        # Probes go on while the containers stop (the kubelet's readiness probes do, so a
        # draining engine's readiness is seen to fail); they end with the pod.
        running = {c.name for c in self.containers.values() if self._running(c)}
        ordering = TerminationOrdering(self.spec, running)
        threads = [threading.Thread(target=self._kill, args=(self.containers[name], grace,
                                                              ordering), daemon=True)
                   for name in running]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.podman.run("pod", "stop", "-t", "0", self.name)
        deletion.gone_at = time.time()
        self._probing.set()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for container in self.containers.values():
            with contextlib.suppress(Exception):
                container.state = self.podman.inspect(container.runtime_name)["State"]
            container.log = self.logs(container.name)
            (logs / f"{container.name}.log").write_text(container.log)
            deletion.containers[container.name] = container
        return deletion

    def _kill(self, container: Container, grace: int, ordering: TerminationOrdering) -> None:
        self.record("Normal", "Killing", container.name, f"Stopping container {container.name}")
        pre_stop = (container.spec.get("lifecycle") or {}).get("preStop")
        if pre_stop and grace > 0:
            grace -= self._pre_stop(container, pre_stop, grace)
        if grace > 0:
            container.waited_for_turn_s = ordering.wait_for_turn(container.name, grace)
            grace -= int(container.waited_for_turn_s)
        grace = max(grace, MINIMUM_GRACE_S)
        container.grace_given = grace
        container.stop_sent_at = time.time()
        done = self.podman.run("stop", "-t", str(grace), container.runtime_name, check=False,
                               timeout=grace + 120)
        container.stopped_at = time.time()
        container.runtime_sigkill = bool(SIGKILL_WARNING.search(done.stderr))
        ordering.terminated(container.name)

    def _pre_stop(self, container: Container, handler: Mapping[str, Any], grace: int) -> int:
        """Run the hook, wait for it at most ``grace`` s; the whole seconds waited."""
        started = time.monotonic()
        box: list[HandlerResult] = []

        def run() -> None:
            result = self.node.run(handler, container.spec, container.runtime_name)
            box.append(result)
            if result.failed:
                self.record("Warning", "FailedPreStopHook", container.name,
                            "PreStopHook failed")

        thread = threading.Thread(target=run, daemon=True, name=f"preStop-{container.name}")
        thread.start()
        thread.join(grace)
        container.hook = box[0] if box else None
        if container.hook is None:
            self._late_hooks.append((container, thread, box))
        return int(time.monotonic() - started)

    def hook_result(self, container: str, timeout: float = 60.0) -> HandlerResult | None:
        """The preStop hook's result, waiting for one that outlived its grace period."""
        found = self.containers[container]
        for late, thread, box in self._late_hooks:
            if late is found:
                thread.join(timeout)
                found.hook = box[0] if box else None
        return found.hook

    # End.

    def close(self) -> None:
        """Remove everything of the pod, whatever state it is in."""
        if self._closed:
            return
        self._closed = True
        self._probing.set()
        self.node.kill_running()
        with contextlib.suppress(Exception):
            self.podman.remove_leftovers(self.name)
        if self._relay is not None and self._relay.poll() is None:
            self._relay.terminate()
            try:
                self._relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait(timeout=10)
        for thread in self._probers:
            thread.join(timeout=30)
        unmount_volumes(self.workdir)
        shutil.rmtree(self._relay_dir, ignore_errors=True)
