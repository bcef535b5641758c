"""Every shipped overlay run as a pod with its engine, a stream in flight, the pod deleted;
and the same pod without the sidecar, as the baselines it must never be worse than.

The pod is the overlay rendered by ``kubectl kustomize`` (its Deployment's pod template, its
ConfigMaps) plus the token Secret a user creates (``kubectl create secret``). What this
machine changes, and nothing else (``Machine``):

- the engine container's image: the engine built here (``images``), with the engine's
  virtualenv, the CPython it was made from and the model mounted read-only by ``hostPath``
  volumes (the coordinator's image is the one the manifests name, built here);
- the model: a tiny one with dummy weights (``tests/engines/tiny_model.py``) in place of the
  overlay's, and the flags an engine needs to serve it on a CPU (named per engine below);
- Dynamo: ``dynamo.mocker`` in place of ``dynamo.vllm`` (as tests/engines/test_overlays_dynamo.py
  explains), file discovery in place of etcd and NATS, and Dynamo's frontend run by the node
  in the pod's network namespace (a frontend elsewhere in the cluster reaches the pod IP);
- TRT-LLM: the simulated engine in trtllm-serve's shape under its command
  (``tests/deploy/engine_shapes.py``), its records on a ``hostPath``.

The strategies (``STRATEGIES``):

- ``sidecar``: the overlay as shipped;
- ``sigterm``: the same pod without the coordinator: no sidecar, no preStop hook, the
  engine's readiness its own ``/health`` (what its startup probe reads); the kubelet's
  SIGTERM is all the engine gets;
- ``prestop-sleep``: the same plus a ``preStop: sleep`` as long as the overlay's min-drain
  (at least 5 s), the usual wait for endpoints to drop the pod, then the engine's own wait;
- ``init``: the ``vllm-init`` overlay as shipped: one container, the coordinator its PID 1
  (``shutdown-coordinator run``), no sidecar, no hook; what it reported is read from its
  log (``init_report``).

What each run shows comes from the records of the things themselves: the runtime's exit code
of each container (``podman inspect``), the kernel's wait status of every process of the pod
(``exits``), the stream as the client read it, the events the kubelet would record, and,
beside them, what the coordinator reported (``/status`` until its drain is done).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.deploy.rendering import ENGINE_INIT, SHIPPED, Rendered, render, stage
from tests.init.wrapper import read_run_log
from tests.pods.exits import ProcessExits
from tests.pods.kubelet import Pod
from tests.pods.podman import PODS_DIR
from tests.pods.spec import Objects
from tests.pods.state import Deletion

TOKEN = "pod-overlay-token-0123456789abcdef0123"
ENGINE = "engine"
COORDINATOR = "shutdown-coordinator"
STRATEGIES = ("sidecar", "sigterm", "prestop-sleep")
INIT = "init"
"""The strategy of the overlay that ships the coordinator as the engine container's init
(``vllm-init``): the overlay as shipped, as ``sidecar`` is for the others."""
RESULTS = PODS_DIR / "results"
"""Each run's outcome as JSON (``report.py`` makes docs/deploy.md's table from them)."""
COORDINATOR_NAMES = ("coordinator-token", "drain-hook", "coordinator-doorbell",
                     "coordinator-state", "coordinator-tmp")


@dataclass
class Machine:
    """What this machine changes in the engine container (see the module's docstring)."""

    image: str
    args: Callable[[list[str]], list[str]]
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    drop_env: tuple[str, ...] = ()
    read_only: dict[str, str] = field(default_factory=dict)
    """Host path → path in the container, mounted read-only."""
    writable: dict[str, str] = field(default_factory=dict)


def without_flags(args: list[str], *flags: str) -> list[str]:
    """``args`` without ``--flag=value`` / ``--flag value`` for each of ``flags``."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if name in flags:
            skip = not eq
            continue
        out.append(arg)
    return out


def rendered(overlay: str, scratch: Path) -> Rendered:
    variant = next(v for v in (*SHIPPED, ENGINE_INIT) if v.name == overlay)
    return Rendered(variant, render(stage(scratch), variant))


def objects_of(pod: Rendered) -> Objects:
    """The rendered ConfigMaps and Secrets, and the token Secret a user creates."""
    objects = Objects.of(pod.docs)
    objects.secrets.setdefault("shutdown-coordinator-token", {"token": TOKEN})
    return objects


def min_drain(pod: Rendered) -> int:
    return int(float(pod.settings.get("SHUTDOWN_COORDINATOR_MIN_DRAIN_S", "0")))


def template(pod: Rendered, machine: Machine, strategy: str) -> dict[str, Any]:
    """The rendered pod template, on this machine, for ``strategy``."""
    assert strategy in (*STRATEGIES, INIT), strategy
    spec: dict[str, Any] = copy.deepcopy(pod.deployment["spec"]["template"])
    pod_spec = spec["spec"]
    engine = next(c for c in pod_spec["containers"] if c["name"] == ENGINE)
    engine["image"] = machine.image
    if machine.command is not None:
        engine["command"] = machine.command
    engine["args"] = machine.args(list(engine.get("args") or []))
    env = [e for e in engine.get("env") or [] if e["name"] not in machine.drop_env]
    env += [{"name": k, "value": v} for k, v in machine.env.items()]
    engine["env"] = env
    mounts = {**{h: (c, True) for h, c in machine.read_only.items()},
              **{h: (c, False) for h, c in machine.writable.items()}}
    for index, (host, (inside, read_only)) in enumerate(sorted(mounts.items())):
        name = f"machine-{index}"
        pod_spec["volumes"].append({"name": name, "hostPath": {"path": host}})
        engine.setdefault("volumeMounts", []).append(
            {"name": name, "mountPath": inside, "readOnly": read_only})
    if strategy not in ("sidecar", INIT):
        pod_spec["initContainers"] = [c for c in pod_spec.get("initContainers") or []
                                      if c["name"] != COORDINATOR]
        engine["env"] = [e for e in engine["env"]
                         if not e["name"].startswith("SHUTDOWN_COORDINATOR_")]
        engine["volumeMounts"] = [m for m in engine["volumeMounts"]
                                  if m["name"] not in COORDINATOR_NAMES]
        pod_spec["volumes"] = [v for v in pod_spec["volumes"]
                               if v["name"] not in COORDINATOR_NAMES]
        health = copy.deepcopy(engine["startupProbe"])
        engine["readinessProbe"] = {**health, "periodSeconds": 2, "failureThreshold": 1,
                                    "timeoutSeconds": 2}
        lifecycle = engine.pop("lifecycle", None) or {}
        lifecycle.pop("preStop", None)
        if strategy == "prestop-sleep":
            lifecycle["preStop"] = {"sleep": {"seconds": max(5, min_drain(pod))}}
        if lifecycle:
            engine["lifecycle"] = lifecycle
    return spec


@dataclass
class StreamRead:
    """A streaming completion as its client read it."""

    tokens: int = 0
    text: str = ""
    finish: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    first_at: float | None = None
    ended_at: float | None = None
    workers: set[int] = field(default_factory=set)
    started: threading.Event = field(default_factory=threading.Event)

    @property
    def verdict(self) -> str:
        """``whole`` (every token and the end marker), ``continued`` (whole, from more than
        one worker) or ``cut``."""
        if not self.done or self.error:
            return "cut"
        return "continued" if len(self.workers) > 1 else "whole"

    def take(self, event: Mapping[str, Any]) -> None:
        worker = ((event.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
        if worker is not None:
            self.workers.add(int(worker))
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish.append(choice["finish_reason"])
            if choice.get("text") or not choice.get("finish_reason"):
                # A token: the last one comes with the finish reason (vLLM, the simulated
                # engine); a chunk with only the reason carries none.
                self.tokens += 1
                self.text += choice.get("text") or ""
                if self.first_at is None:
                    self.first_at = time.time()
                    self.started.set()


def read_stream(client: httpx.Client, body: Mapping[str, Any], read: StreamRead,
                path: str = "/v1/completions") -> None:
    """POST a streaming completion and read it to its end (run in a thread)."""
    try:
        with client.stream("POST", path, json=dict(body)) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    read.done = True
                elif line.startswith("data: {"):
                    read.take(json.loads(line[len("data: "):]))
    except Exception as exc:  # the verdict says "cut"; the test reads the reason
        read.error = f"{type(exc).__name__}: {exc}"
    finally:
        read.ended_at = time.time()
        read.started.set()


@dataclass
class ProcessEnd:
    pod_pid: int
    name: str
    end: str
    """``exit N`` or ``killed by SIG…``, from the kernel; ``unknown`` if no record came."""


@dataclass
class Outcome:
    """One overlay, one strategy: the pod deleted with a stream in flight."""

    overlay: str
    strategy: str
    grace_period: int
    engine_exit: int | None
    sidecar_exit: int | None
    hook: str
    events: list[str]
    processes: list[ProcessEnd]
    stream: str
    stream_tokens: int
    stream_text: str
    stream_error: str | None
    seconds: float
    runtime_sigkill: list[str]
    drain: dict[str, Any] | None
    """The coordinator's last ``/status`` (its drain summary), sidecar runs only; as the
    engine's init, what it logged (``init_report``)."""
    load_average: float | None = None
    """The machine's 1-minute load average when the pod was deleted (timings are read
    against it: the machine is shared)."""

    def save(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{self.overlay}-{self.strategy}.json").write_text(
            json.dumps(asdict(self), indent=1))


def hook_verdict(pod: Pod) -> str:
    engine = pod.containers[ENGINE]
    if (engine.spec.get("lifecycle") or {}).get("preStop") is None:
        return "none"
    result = pod.hook_result(ENGINE)
    if result is None:
        return "still running at the grace period's end"
    if result.kind == "sleep":
        return "sleep, 0"
    if result.failed:
        return f"{result.kind}: {result.error} (FailedPreStopHook)"
    return f"{result.kind}, {result.exit_code if result.kind == 'exec' else result.status}"


def init_report(log: str) -> dict[str, Any] | None:
    """What the coordinator as the engine container's init reported, from its log (its API
    is on the container's loopback and ends with it), in ``/status``'s shape: ``drain`` its
    drain's end line, ``processes`` its line for each process it ended (``exit_code`` as a
    number, negative for a signal); and ``init``, its summary, the log's last line. None
    when that last line is not its summary."""
    found = read_run_log(log)
    if found.summary is None:
        return None
    drain = dict(found.drain or {})
    drain["causes"] = drain["causes"].split(" | ") if drain.get("causes") else []
    processes = [{**fields, "pid": pid, "exit_code": None if fields.get("exit_code") is None
                  else int(fields["exit_code"])} for pid, fields in found.processes.items()]
    return {"drain": drain, "processes": processes, "init": found.summary}


class StatusWatch:
    """The coordinator's ``/status``, long-polled through the pod's relay until its drain is
    done (or the coordinator is gone); the last answer is kept."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.last: dict[str, Any] | None = None
        self.error: str | None = None
        """Why the watch ended before the drain was done, if it did."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="status-watch")
        self._thread.start()

    def _run(self) -> None:
        params: dict[str, Any] = {}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            with self.pod.client("coordinator", COORDINATOR, timeout=60,
                                 headers=headers) as client:
                while True:
                    status: dict[str, Any] = client.get("/status", params=params).json()
                    self.last = status
                    if status.get("phase") == "done":
                        return
                    params = {"wait": 10, "since": status["generation"]}
        except (httpx.HTTPError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def result(self, timeout: float = 60.0) -> dict[str, Any] | None:
        self._thread.join(timeout)
        return self.last


def delete_under_load(pod: Pod, *, overlay: str, strategy: str, exits: ProcessExits,
                      stream: Callable[[StreamRead], None],
                      during: Callable[[], None] | None = None) -> tuple[Outcome, Deletion]:
    """1. Note every process of the running pod (its host PID, its pod PID, its name).
    2. Start the stream (``stream`` reads it into a ``StreamRead``, in a thread) and wait for
       its first token; watch the coordinator's ``/status`` when there is one.
    3. Delete the pod as the kubelet does (``during`` runs beside the deletion: a test's
       control of a simulated engine).
    4. Gather the outcome from the records: the runtime's exit codes, the kernel's wait
       status of every process noted and of all they forked, the stream as read, the hook,
       the events, how long the deletion took; and the coordinator's last status."""
    noted_at = time.time()
    processes = {p.host_pid: p for p in pod.processes()}
    read = StreamRead()
    reader = threading.Thread(target=stream, args=(read,), daemon=True, name="stream")
    reader.start()
    assert read.started.wait(300), "no token streamed"
    assert read.error is None, read.error
    assert not read.done, "the stream ended before the deletion"
    watch = StatusWatch(pod) if COORDINATOR in pod.containers else None
    helper = threading.Thread(target=during, daemon=True) if during else None
    if helper:
        helper.start()
    load_average = round(os.getloadavg()[0], 1)
    deletion = pod.delete()
    reader.join(timeout=120)
    if helper:
        helper.join(timeout=60)
    drain = watch.result() if watch else None
    if strategy == INIT:
        drain = init_report(deletion.containers[ENGINE].log)
    everything = exits.descendants(set(processes), noted_at) - {pod.infra_pid or 0}
    ends = exits.wait_for(everything, noted_at, timeout=30)
    names = {pid: proc.cmdline.split(" ")[0] if "::" in proc.cmdline else proc.name
             for pid, proc in processes.items()}
    ended = []
    for pid in sorted(everything, key=lambda p: processes[p].pod_pid if p in processes else p):
        if pid == pod.infra_pid:
            continue
        end = ends.get(pid)
        known = processes.get(pid)
        parent = exits.parent_of(pid)
        name = names.get(pid) or f"a child of {names.get(parent or 0, parent)}"
        ended.append(ProcessEnd(known.pod_pid if known else -1, name,
                                end.describe() if end else "unknown"))
    sidecar = deletion.containers.get(COORDINATOR)
    outcome = Outcome(
        overlay=overlay, strategy=strategy, grace_period=deletion.grace_period,
        engine_exit=deletion.containers[ENGINE].exit_code,
        sidecar_exit=sidecar.exit_code if sidecar else None,
        hook=hook_verdict(pod),
        # A failed hook whenever it comes; a restart the kubelet would have made for a
        # failed liveness probe before the deletion (in a terminating pod it restarts
        # nothing). Single failed probes are no fault: one may run before a server listens,
        # and the engine's readiness fails on purpose once a drain starts.
        events=[f"{e.type} {e.reason} {e.container}: {e.message}" for e in pod.events
                if e.reason == "FailedPreStopHook"
                or ("failed liveness probe" in e.message and e.at < deletion.started_at)],
        processes=ended, stream=read.verdict, stream_tokens=read.tokens,
        stream_text=read.text, stream_error=read.error, seconds=round(deletion.seconds, 1),
        runtime_sigkill=[c.name for c in deletion.containers.values() if c.runtime_sigkill],
        drain=drain, load_average=load_average)
    outcome.save()
    return outcome, deletion


def release_when_signalled(records: Path, root_pod_pid: int, root_host_pid: int,
                           release: signal.Signals, timeout: float = 120.0) -> Callable[[], None]:
    """A ``during`` for the simulated engine: once its root recorded its SIGTERM, send it
    ``release`` (its held streams then run to their end)."""

    def run() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in records.glob(f"*-{root_pod_pid}.json"):
                if json.loads(path.read_text()).get("signal") == "SIGTERM":
                    os.kill(root_host_pid, release)
                    return
            time.sleep(0.05)

    return run
