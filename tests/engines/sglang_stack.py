"""The real SGLang (0.5.23, on this CPU) for the engine tests and the bench.

SGLang runs here through its out-of-tree platform interface (``tests/engines/sglang_cpu_platform``,
installed into its virtualenv by ``scripts/engines.sh sglang``): torch-native attention and
sampling, float32, a small KV pool, the tiny Llama with dummy weights. Its dummy weights are
drawn with a fixed seed (``initialize_dummy_weights(seed=1234)``) and sampling is greedy at
temperature 0, so two servers generate the same tokens for the same prompt: a stream continued
on a second server can be held token for token against one generated whole.

Each process of its tree can be traced from the start of a test (``trace_tree``): strace
attached to every process, read back as ``strace_record.Record``.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import httpx
import psutil

from devstack import routers
from devstack.routers import RouterProcess, free_port
from tests.engines import strace_record
from tests.engines.stack import (
    ROOT,
    Coordinator,
    Vllm,
    engine_python,
    pattern_for,
    spawn_logged,
    start_coordinator,
    tree,
    wait_http,
)
from tests.support.processes import ProcessJanitor, wait_for

if TYPE_CHECKING:
    from tests.continuation.stack import Proxy

SGLANG_START_S = 420.0
"""Bound on SGLang's start (about 30-40 s on 2 idle cores; far more under a loaded CI)."""

ENGINE_FLAGS = (
    "--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch", "--dtype", "float32", "--mem-fraction-static", "0.1",
    "--max-total-tokens", "8192", "--skip-server-warmup", "--disable-radix-cache",
    "--enable-metrics",
)
"""What SGLang needs on this CPU (docs/engines.md); the model path, host and port are added."""

LAUNCH_SERVER = ("-m", "sglang.launch_server")


@dataclass
class Sglang:
    """One SGLang server: its main process (the test's child), URL and log."""

    proc: subprocess.Popen[Any]
    url: str
    log: Path
    model: str

    def names(self) -> dict[int, str]:
        return tree(self.proc.pid)


def start_sglang(
    janitor: ProcessJanitor, tmp: Path, model_dir: Path, *, argv: Sequence[str] = LAUNCH_SERVER,
    flags: Sequence[str] = (), env: dict[str, str] | None = None, port: int | None = None,
    engine_flags: Sequence[str] = ENGINE_FLAGS,
) -> Sglang:
    """Start SGLang (``python -m sglang.launch_server`` unless ``argv`` names another entry
    point taking the same flags) on ``port`` (a free one by default) and wait until
    ``/health`` answers 200. ``engine_flags`` replace ``ENGINE_FLAGS`` (a bench that needs
    SGLang's radix cache, on by default, leaves out ``--disable-radix-cache``)."""
    python = engine_python("sglang")
    port = port or free_port()
    log = tmp / f"sglang-{port}.log"
    argv_all = [str(python), *argv, "--model-path", str(model_dir), *engine_flags,
                "--host", "127.0.0.1", "--port", str(port), *flags]
    environment = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = spawn_logged(janitor, argv_all, log, env=environment)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, log, timeout=SGLANG_START_S, what="SGLang healthy")
    return Sglang(proc=proc, url=url, log=log, model=str(model_dir))


@dataclass
class Trace:
    """strace attached to an engine's tree; ``record()`` once it detached."""

    proc: subprocess.Popen[Any]
    out: Path
    names: dict[int, str]
    """PID → what it is: its title (``sglang::scheduler``), else its command line."""
    threads: dict[int, int] = field(default_factory=dict)
    """Thread id → PID of the threads those processes had once strace held them."""

    def record(self, timeout: float = 60) -> strace_record.Record:
        """Wait for strace to end (it does when every traced process is gone)."""
        self.proc.wait(timeout=timeout)
        return strace_record.parse(self.out.read_text(errors="replace"), self.threads)


def trace_tree(janitor: ProcessJanitor, tmp: Path, root: int, name: str) -> Trace:
    """Attach strace to ``root`` and every process under it, and wait until it is attached."""
    names = {pid: title if "::" in title else _cmdline(pid, title)
             for pid, title in tree(root).items()}
    out = tmp / f"strace-{name}.txt"
    log = tmp / f"strace-{name}.log"
    with log.open("ab") as handle:
        proc = janitor.spawn(strace_record.attach_argv(names, out), stdout=handle,
                             stderr=subprocess.STDOUT)
    # strace says "Process N attached" on stderr for each -p once it holds it.
    wait_for(lambda: log.read_text(errors="replace").count("attached") >= len(names)
             or proc.poll() is not None, timeout=60, what="strace attached")
    assert proc.poll() is None, log.read_text(errors="replace")
    return Trace(proc=proc, out=out, names=names,
                 threads=strace_record.process_threads(names))


def adopt(janitor: ProcessJanitor, tmp: Path, model: Path, sglang: Sglang, trace: Trace,
          grace_s: int) -> Coordinator:
    """A coordinator with SGLang's profile, adopting this SGLang alone (its model path in the
    pattern: other SGLangs on the machine are not its business), once it lists every traced
    process."""
    coordinator = start_coordinator(
        janitor, tmp, "--engine", "sglang", "--grace-period", str(grace_s),
        "--adopt-pattern", f"sglang\\.launch_server .*{pattern_for(model)}",
        "--engine-metrics-url", sglang.url + "/metrics", "--scan-interval", "0.5")
    wait_for(lambda: set(trace.names) <= {p["pid"] for p in coordinator.status()["processes"]},
             timeout=60, what="the coordinator lists the whole SGLang tree")
    return coordinator


def drain(coordinator: Coordinator, tmp: Path, name: str) -> dict[str, Any]:
    """GET /drain (the kubelet's preStop hook); its summary, also kept as ``name``.json."""
    with coordinator.client(timeout=240) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    (tmp / f"{name}.json").write_text(json.dumps(summary, indent=1))
    return summary


def assert_sglang_stopped_itself(summary: dict[str, Any], trace: Trace,
                                 main: int) -> tuple[strace_record.Record, list[int]]:
    """An adopted SGLang drained with its profile, held against strace: the main process got
    one SIGTERM, from outside its tree, and exited 0; every SIGKILL was sent by the main
    process's own ``kill`` calls; the summary's exit codes are strace's, the coordinator
    killed nothing, and its outcome names the engine's SIGKILL and loses nothing. Returns
    the record and the SIGKILLed processes."""
    record = trace.record()
    assert record.ends[main].exit_code == 0, record.ends[main]
    terms = [r for r in record.ends[main].received if r.signal == "SIGTERM"]
    assert len(terms) == 1, record.ends[main]
    assert terms[0].sender not in trace.names, record.ends[main]
    killed = [pid for pid in trace.names if record.ends[pid].killed_by == "SIGKILL"]
    for pid in killed:
        assert record.senders_of(pid, "SIGKILL") == [main], (trace.names[pid], record.sent)
    processes = {p["pid"]: p for p in summary["processes"]}
    for pid in trace.names:
        assert processes[pid]["exit_code"] == record.ends[pid].wait_status, processes[pid]
        assert processes[pid]["killed_at"] is None, processes[pid]
    assert processes[main]["tier"] == "sglang-root"
    assert summary["outcome"] == "signalled"
    assert summary["drain"]["lost_requests"] == 0
    causes = " ".join(summary["drain"]["causes"])
    assert "a SIGKILL sent by the engine itself, not by the coordinator" in causes
    return record, killed


def _cmdline(pid: int, default: str) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()) or default
    except psutil.Error:
        return default


@dataclass
class Stream:
    """One streamed completion as the client received it."""

    tokens: list[int] = field(default_factory=list)
    """Token ids (``return_token_ids``), in order."""
    text: str = ""
    done: bool = False
    """``[DONE]`` arrived."""
    finish_reason: str | None = None
    handed_back: dict[str, Any] | None = None
    error: str | None = None
    chunks: int = 0
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def whole(self) -> bool:
        return self.done and self.error is None


def events(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


def stream_completion(url: str, body: dict[str, Any], stream: Stream,
                      headers: dict[str, str] | None = None) -> None:
    """POST a streamed completion and fill ``stream`` as it arrives (run it in a thread)."""
    try:
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers,
                          timeout=httpx.Timeout(600, connect=30)) as response:
            if response.status_code != 200:
                stream.error = f"HTTP {response.status_code}: {response.read()[:300]!r}"
                return
            for data in events(response):
                if data == "[DONE]":
                    stream.done = True
                    break
                event = json.loads(data)
                if event.get("handed_back"):
                    stream.handed_back = event
                    continue
                if "error" in event:  # the proxy's, or the engine's
                    stream.error = json.dumps(event["error"])[:500]
                    continue
                for choice in event.get("choices", ()):
                    stream.tokens += choice.get("token_ids") or []
                    stream.text += choice.get("text") or choice.get("delta", {}).get(
                        "content") or ""
                    stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
                stream.chunks += 1
                stream.started.set()
    except httpx.HTTPError as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        stream.started.set()
        stream.ended.set()


def start_stream(url: str, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> Stream:
    stream = Stream()
    threading.Thread(target=stream_completion, args=(url, body, stream, headers),
                     daemon=True).start()
    return stream


DRAINABLE = ("-u", str(ROOT / "deploy" / "examples" / "sglang" / "drainable_server.py"))
"""The drainable integration, run with SGLang's own flags (``start_sglang``'s ``argv``)."""


PROXY_FLAGS = {"vllm-router": (), "smg": ("--no-token-ids",)}
"""The continuation proxy's flags in front of each router. smg 1.13.0 refuses a completion
whose prompt is token ids (400: its ``prompt`` is a string or a list of strings), so in front
of it completions are continued by text; vllm-router passes the ids on to SGLang."""


Engine = TypeVar("Engine", Sglang, Vllm)


@dataclass
class DrainablePod(Generic[Engine]):
    """The drainable server with its coordinator, behind a router beside a peer, and the
    continuation proxy in front of the router (acknowledging handoffs to that coordinator)."""

    coordinator: Coordinator
    drained: Engine
    router: RouterProcess
    proxy: Proxy

    @property
    def proxy_url(self) -> str:
        return self.proxy.url


StartDrained = Callable[[int, Coordinator], Engine]
"""Starts the drainable server on a port, registered with a coordinator; returns once it
serves."""


@overload
def start_drainable_pod(janitor: ProcessJanitor, tmp: Path, model_dir: Path,
                        peer: Sglang | Vllm, grace_s: float, router: str = ..., *,
                        start_drained: None = None) -> DrainablePod[Sglang]: ...


@overload
def start_drainable_pod(janitor: ProcessJanitor, tmp: Path, model_dir: Path,
                        peer: Sglang | Vllm, grace_s: float, router: str = ..., *,
                        start_drained: StartDrained[Engine]) -> DrainablePod[Engine]: ...


def start_drainable_pod(janitor: ProcessJanitor, tmp: Path, model_dir: Path,
                        peer: Sglang | Vllm, grace_s: float, router: str = "vllm-router", *,
                        start_drained: StartDrained[Any] | None = None) -> DrainablePod[Any]:
    """1. ``router`` (round robin) in front of ``peer``; 2. the drainable server's
    coordinator, told of the router and of the server's address; 3. the drainable server
    (``start_drained``; SGLang's by default) registered with it, which the coordinator then
    adds to the router; 4. the continuation proxy in front of the router (``PROXY_FLAGS``)."""
    from tests.continuation.stack import start_proxy
    from tests.routers.stack import janitor_spawn, router_binary

    def start_sglang_drainable(port: int, coordinator: Coordinator) -> Sglang:
        return start_sglang(janitor, tmp, model_dir, argv=DRAINABLE, port=port,
                            flags=["--coordinator", coordinator.url])

    router_binary(router)
    front = routers.start_router(router, janitor_spawn(janitor), tmp, [peer.url])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    coordinator = start_coordinator(janitor, tmp, "--grace-period", f"{grace_s:g}",
                                    "--router", f"{router}={front.url}",
                                    "--router-worker-url", url)
    drained = (start_drained or start_sglang_drainable)(port, coordinator)
    wait_for(lambda: [w["pid"] for w in coordinator.status()["workers"]] == [drained.proc.pid],
             timeout=60, what="the drainable server registered")
    wait_for(lambda: front.routes_to(url), timeout=120,
             what=f"{router} routing to the drained server")
    proxy = start_proxy(janitor, tmp, front.url, "--coordinator", coordinator.url,
                        *PROXY_FLAGS[router])
    return DrainablePod(coordinator, drained, front, proxy)


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy completion that runs to ``max_tokens`` and returns token ids."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
