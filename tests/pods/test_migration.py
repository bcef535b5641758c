"""The migrating overlays as pods, one engine pod deleted under streaming load: its streams
continue on the other pod.

What a platform engineer applies (``kubectl apply -k deploy/kubernetes/overlays/vllm-migrating``,
or ``sglang-migrating``) is two kinds of pods: the engine's (the drainable server, worker_client
inside the engine, with the coordinator as its native sidecar) and the continuation proxy's,
with vllm-router in front of the engine pods. Here, on one ``network.ClusterNetwork``, for each
engine (``CASES``):

- two engine pods from the overlay's Deployment (``overlays.template``, the real vLLM or SGLang
  on the CPU, ``Machine`` says what this machine changes), their image the recipe's drainable
  target (``images.drainable_engine``);
- one proxy pod from the overlay's ``continuation-proxy`` Deployment, as rendered;
- vllm-router on the node, where the router Service's name points (``hostAliases``: there is
  no cluster DNS; the headless coordinator Service's name points at both engine pods).

Each engine pod's coordinator adds its engine to the router at start and removes it at the
drain's first millisecond (the overlay's router component), as it would in a cluster.

Ground truth: the client's token ids (``return_token_ids``) and chat text against what the
other pod generates whole for the same request (greedy, the same dummy weights); the drained
engine's own log (which requests it handed back, after how many tokens); podman's record of
every container's exit; the kernel's record of every process of the deleted pod. The
coordinator's summary and the proxy's counters are held against those.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.routers import router_argv
from tests.engines.continued import (
    COMPLETION_PROMPT,
    HANDED,
    assert_continued,
    assert_counts_agree,
    chat_body,
    reference,
)
from tests.engines.sglang_stack import Stream, completion_body, start_stream
from tests.engines.stack import ENGINES
from tests.pods.conftest import PodFactory
from tests.pods.exits import ProcessExits
from tests.pods.images import Images
from tests.pods.kubelet import Pod
from tests.pods.network import ClusterNetwork
from tests.pods.overlays import (
    COORDINATOR,
    ENGINE,
    Machine,
    StatusWatch,
    objects_of,
    rendered,
    template,
    without_flags,
)
from tests.pods.podman import Podman
from tests.pods.test_overlays import SGLANG_CPU, START_S, engine_venv, mounted
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]

WARM_UP_TOKENS = 64
ENGINE_CPU = "750m"
"""Each engine container's CPU limit (``resources.limits.cpu``). Unlimited, each tiny
vLLM streams over 2,000 tokens a second, and the servers, the router, the proxy and the
client relaying four such streams take the other core and more: the first event of a stream
then came 6-14 s after it was sent, and a 16,000-token stream on the deleted pod ended
before the kubelet's preStop hook reached the drain. Limited, the engines leave the relay
chain room, and their streams run for tens of seconds."""


@dataclass(frozen=True)
class Case:
    """One migrating overlay: its engine on this machine, its port, its streams' length."""

    overlay: str
    machine: Callable[[Images, Path], Machine]
    port: int
    tokens: int
    """Tokens of each stream: still running when the deletion reaches the drain through the
    preStop hook (a ``podman exec``), and, continued, well inside the engine's context."""
    cpu: str | None = None


def drainable_vllm(images: Images, model: Path) -> Machine:
    """The drainable vLLM server on the CPU: the tiny model with dummy weights, the flags the
    engine tests start vLLM with (its context the tiny model's 16,384)."""
    venv = engine_venv("vllm")
    return Machine(
        image=images.drainable_engine("vllm", venv),
        args=lambda args: [*without_flags(args, "--model"), "--model=/model",
                           "--served-model-name=tiny", "--load-format=dummy",
                           "--max-model-len=16384", f"--kv-cache-memory-bytes={256 * 2**20}"],
        env={"OMP_NUM_THREADS": "1"}, read_only=mounted(venv, model))


def drainable_sglang(images: Images, model: Path) -> Machine:
    """The drainable SGLang server on the CPU, with the flags the sglang overlay's pod test
    runs SGLang with (``SGLANG_CPU``), but room for four 6,000-token streams in its KV
    cache."""
    venv = engine_venv("sglang")
    flags = [f for f in SGLANG_CPU if not f.startswith("--max-total-tokens=")]
    return Machine(
        image=images.drainable_engine("sglang", venv),
        args=lambda args: [*without_flags(args, "--model-path"), "--model-path=/model",
                           *flags, "--max-total-tokens=32768"],
        env={"OMP_NUM_THREADS": "1"}, read_only=mounted(venv, model))


CASES = {
    # Each under the same CPU limit: unlimited, a 1,500-token SGLang stream was over before
    # the drain on an idle machine.
    "vllm": Case("vllm-migrating", drainable_vllm, 8000, 16000, ENGINE_CPU),
    "sglang": Case("sglang-migrating", drainable_sglang, 30000, 6000, ENGINE_CPU),
}
ROUTER_NAME = "vllm-router.default.svc.cluster.local"
"""The router Service's name in the overlay's router component (its
``SHUTDOWN_COORDINATOR_ROUTERS``), which the proxy's ``--upstream`` copies."""
ROUTER_PORT = 8000
COORDINATORS_NAME = "inference-engine-coordinator.default.svc.cluster.local"
"""The headless Service the proxy resolves to find every engine pod's coordinator."""
PROXY_PORT = 8000


def with_aliases(spec: dict[str, Any], aliases: dict[str, list[str]]) -> dict[str, Any]:
    """``spec`` (a pod template) with ``hostAliases``: IP → names."""
    spec = copy.deepcopy(spec)
    spec["spec"]["hostAliases"] = [{"ip": ip, "hostnames": names}
                                   for ip, names in aliases.items()]
    return spec


@pytest.fixture
def router(cluster_network: ClusterNetwork, janitor: ProcessJanitor,
           tmp_path: Path) -> Iterator[str]:
    """vllm-router (round robin, no worker yet) on the node's address on the pod network, at
    the port its Service names; its URL from the node."""
    binary = ENGINES / "routers" / "bin" / "vllm-router"
    if not binary.exists():
        pytest.skip(f"vllm-router is not installed in {ENGINES}: run scripts/engines.sh routers")
    argv = router_argv("vllm-router", ROUTER_PORT, [])
    argv[argv.index("--host") + 1] = cluster_network.node_ip
    argv.remove("--worker-urls")
    log = tmp_path / "vllm-router.log"
    with log.open("wb") as out:
        proc = janitor.spawn(argv, stdout=out, stderr=out, env={"NO_COLOR": "1"})
    url = f"http://{cluster_network.node_ip}:{ROUTER_PORT}"

    def answers() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"{url}/list_workers", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout=60, what="vllm-router listening")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def routed(router: str) -> set[str]:
    return set(httpx.get(f"{router}/list_workers", timeout=10).json().get("urls") or [])


def start_all(pods_to_start: list[Pod]) -> None:
    """Start the pods side by side (each ``Pod.start`` returns once it is Ready)."""
    errors: list[BaseException] = []

    def start(pod: Pod) -> None:
        try:
            pod.start(ready_timeout=START_S)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(pod,), daemon=True) for pod in pods_to_start]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def warm_up(urls: list[str]) -> None:
    """A completion and a chat side by side on each engine, directly: vLLM's CPU build
    compiles each new batch shape at its first use (10-17 s each here with two engines
    busy), which would otherwise delay the test's streams one by one while those sent
    before them run towards their end."""
    streams = [start_stream(url + path, body) for url in urls for path, body in (
        ("/v1/completions", completion_body("tiny", COMPLETION_PROMPT, WARM_UP_TOKENS)),
        ("/v1/chat/completions", chat_body("tiny", WARM_UP_TOKENS)))]
    for stream in streams:
        assert stream.ended.wait(600), "a warm-up stream did not end"
        assert stream.whole, stream.error


def send_all(url: str, requests: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Stream]:
    """Stream each ``(name, path, body)`` at once (``name`` its ``X-Request-Id``); return once
    each has its first event: the router sent it on and the engine it landed on started it.
    Round robin puts two of the four on each engine, whichever they are. (Sent one by one,
    each once the one before started, the first events of unlimited vLLM engines came
    10-17 s apart here, while those sent first ran towards their end.)"""
    streams = {name: start_stream(url + path, body, {"X-Request-Id": name})
               for name, path, body in requests}
    for name, stream in streams.items():
        assert stream.started.wait(300), f"{name} not started"
        assert stream.error is None, (name, stream.error)
    return streams


def keep_logs(where: Path, pods_run: list[Pod]) -> None:
    """Every container's log of ``pods_run`` (a deleted pod's as the runtime kept it)."""
    for pod in pods_run:
        for name in pod.containers:
            (where / f"{pod.name}-{name}.log").write_text(pod.logs(name))


def proxy_counts(proxy: Pod) -> dict[str, float]:
    text = httpx.get(f"http://{proxy.ip}:{PROXY_PORT}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("continuation_proxy_") and name.endswith("_total"):
            counts[name[len("continuation_proxy_"):-len("_total")]] = float(value)
    return counts


@pytest.mark.parametrize("engine", list(CASES))
def test_a_migrating_overlay_pod_deleted_under_streaming_load_has_every_stream_continued(
        engine: str, images: Images, podman: Podman, model: Path, cluster_network: ClusterNetwork,
        router: str, pods: PodFactory, process_exits: ProcessExits, tmp_path: Path) -> None:
    """1. The overlay rendered; two engine pods from its Deployment on one pod network,
       started side by side; each coordinator adds its engine to vllm-router (the router's
       own list).
    2. The proxy pod from the overlay's continuation-proxy Deployment, Ready.
    3. Each engine warmed up (``warm_up``); what the second pod generates whole, asked
       directly: a completion's token ids and a chat's text (the reference).
    4. Two completions (token ids) and two chats streamed through the proxy, all at once,
       until each has its first event: round robin puts two of them on the first pod.
    5. The first pod deleted as the kubelet deletes it (preStop hook, then SIGTERM to each
       container, the sidecar last), its coordinator's ``/status`` watched.
    6. Every stream ends with ``[DONE]``: each completion's token ids and each chat's text
       exactly the reference's (none lost, none duplicated); the first pod's engine handed
       its two back mid-stream (its log), and nothing else but continuations the router
       sent it before it was told, before their first token; the router no longer lists
       it.
    7. Both containers of the first pod exit 0 (podman), every process of it exits 0 (the
       kernel), nothing SIGKILLed; the drain is graceful, nothing lost, and its handoff
       counts are the engine's log's and the proxy's.
    8. The second pod and the proxy deleted: every container exits 0."""
    case = CASES[engine]
    tokens = case.tokens
    manifest = rendered(case.overlay, tmp_path / "render")
    objects = objects_of(manifest)
    machine = case.machine(images, model)
    to_router = {cluster_network.node_ip: [ROUTER_NAME]}
    engine_template = with_aliases(template(manifest, machine, "sidecar"), to_router)
    if case.cpu is not None:
        container = next(c for c in engine_template["spec"]["containers"] if c["name"] == ENGINE)
        container["resources"].setdefault("limits", {})["cpu"] = case.cpu
    first, second = (pods(engine_template, objects, name=f"engine-{n}", network=cluster_network)
                     for n in ("a", "b"))
    start_all([first, second])
    urls = {f"http://{pod.ip}:{case.port}" for pod in (first, second)}
    wait_for(lambda: routed(router) == urls, timeout=120,
             what=f"both engines routed: {urls}")

    proxy_doc = next(d for d in manifest.docs if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "continuation-proxy")
    proxy_template = with_aliases(proxy_doc["spec"]["template"], {
        cluster_network.node_ip: [ROUTER_NAME],
        first.ip: [COORDINATORS_NAME], second.ip: [COORDINATORS_NAME]})
    proxy_image = proxy_template["spec"]["containers"][0]["image"]
    assert proxy_image == images.sidecar(), proxy_image
    proxy = pods(proxy_template, objects, name="proxy", network=cluster_network)
    proxy.start(ready_timeout=120)

    warm_up([f"http://{pod.ip}:{case.port}" for pod in (first, second)])
    expected = reference(f"http://{second.ip}:{case.port}", "tiny", tokens)
    assert len(expected.ids) == tokens
    completion = completion_body("tiny", COMPLETION_PROMPT, tokens)
    proxy_url = f"http://{proxy.ip}:{PROXY_PORT}"
    streams = send_all(proxy_url, [
        ("completion-1", "/v1/completions", completion),
        ("completion-2", "/v1/completions", completion),
        ("chat-1", "/v1/chat/completions", chat_body("tiny", tokens)),
        ("chat-2", "/v1/chat/completions", chat_body("tiny", tokens)),
    ])

    noted_at = time.time()
    processes = {p.host_pid: p for p in first.processes()}
    watch = StatusWatch(first)
    deletion = first.delete()
    status = watch.result()
    keep_logs(tmp_path, [first, second, proxy])

    print(json.dumps({"deleted_in_s": round(deletion.seconds, 1),
                      "grace_period": deletion.grace_period,
                      "drain": {k: ((status or {}).get("drain") or {}).get(k) for k in (
                          "outcome", "lost_requests", "started_at", "ended_at")},
                      "streams": {n: [len(s.tokens), len(s.text), s.done]
                                  for n, s in streams.items()},
                      "load_average": round(os.getloadavg()[0], 1)}))
    assert_continued(streams, expected, by_ids=True)
    log = (tmp_path / f"{first.name}-{ENGINE}.log").read_text(errors="replace")
    handed = [(name, int(attempt), int(n)) for name, attempt, n in HANDED.findall(log)]
    first_attempts = [(name, n) for name, attempt, n in handed if attempt == 0]
    assert len({name for name, _ in first_attempts}) == len(first_attempts) == 2, handed
    assert all(0 < n < tokens for _, n in first_attempts), handed
    # A continuation the router still sent there before it was told is handed back again,
    # before its first token.
    assert all(n == 0 for _, attempt, n in handed if attempt), handed
    assert routed(router) == {f"http://{second.ip}:{case.port}"}

    for name in (ENGINE, COORDINATOR):
        ended = deletion.containers[name]
        assert (ended.exit_code, ended.runtime_sigkill) == (0, False), (name, ended.log[-3000:])
    everything = process_exits.descendants(set(processes), noted_at) - {first.infra_pid or 0}
    ends = process_exits.wait_for(everything, noted_at, timeout=30)
    names = {pid: p.cmdline for pid, p in processes.items()}
    assert {names.get(pid, pid): end.describe() if end else "unknown"
            for pid, end in ((pid, ends.get(pid)) for pid in everything)
            if end is None or end.describe() != "exit 0"} == {}
    assert deletion.seconds < deletion.grace_period

    assert status is not None, watch.error
    assert status["phase"] == "done", status
    summary = status["drain"]
    assert summary["outcome"] == "graceful", json.dumps(summary)
    assert summary["lost_requests"] == 0, json.dumps(summary)
    want = assert_counts_agree(status["migration_counts"], handed, len(streams))
    wait_for(lambda: {k: proxy_counts(proxy).get(k) for k in want} == want, timeout=30,
             what=f"the proxy's counts {want}: {proxy_counts(proxy)}")

    for pod, name in ((second, ENGINE), (second, COORDINATOR), (proxy, "proxy")):
        if pod.deletion is None:
            pod.delete()
        assert pod.deletion is not None
        ended = pod.deletion.containers[name]
        assert (ended.exit_code, ended.runtime_sigkill) == (0, False), \
            (pod.name, name, ended.log[-3000:])
