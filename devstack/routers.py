"""The routers people run in front of SGLang and vLLM, started for real in front of workers.

SGLang Model Gateway (``smg``) and ``vllm-router`` are Rust binaries from PyPI that
``bash scripts/engines.sh routers`` installs into ``.engines/routers/`` (never ``.venv``).
Tests, benchmarks and local pod fleets (``devstack.local_stack``) start them here:

    router = start_router("smg", spawn, workdir, ["http://127.0.0.1:8001", ...])
    router.url                         # where clients send /v1/completions
    router.listed()                    # {worker URL: "ready" | "draining" | ... | "listed"}
    router.remove_worker(url)          # through the router's own worker API
    router.add_worker(url)             # and back (returns once the router routes to it)
    stop_router(router)                # SIGTERM, a bounded wait, SIGKILL

    load = RouterLoad(router.url, clients=6, max_tokens=40, prefix="t")
    running = asyncio.create_task(load.run())   # streams back to back until load.stop()
    load.sent                          # every stream: when it was sent, what came back

``spawn(argv, log, env)`` starts the process (its output appended to ``log``, ``env`` the
variables to add) and returns its ``Popen``: the tests' janitor, or ``LocalStack.spawn``.
Neither router reports a port 0 bind, so the port is one found free a moment before
(``free_port``) unless the caller names one. docs/routers.md says what each router asks of
an engine and what its worker API does, as seen here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from devstack import looks
from devstack.sim.tokens import expected_tokens
from router_client import sse

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("smg", "vllm-router")
START_TIMEOUT_S = 60.0
"""Bound on a router's start with every worker registered (about 1 s on 2 idle cores)."""
STOP_TIMEOUT_S = 10.0
"""A router's stop on SIGTERM: smg keeps its listener open for min(grace / 2, 5 s) first."""
SMG_SHUTDOWN_GRACE_S = 2
"""``smg --shutdown-grace-period-secs``: its default (180 s, of which 5 s of settle before it
stops listening) would make every stop wait on the router."""
SMG_SETTLE_S = 1
"""``drain_settle_secs`` ``remove_worker`` gives an smg worker before its removal."""
CALL_TIMEOUT_S = 5.0
"""One call to a router's API."""
ADD_TIMEOUT_S = 30.0
"""One call that adds a worker: vllm-router checks the worker's ``/health`` before it
answers, which a busy engine answered in 2.9 s here (SGLang's runs a generation), and past
5 s on a slower machine."""
POLL_S = 0.02

Spawn = Callable[[Sequence[str], Path, dict[str, str]], "subprocess.Popen[Any]"]
"""Starts ``argv`` with its output appended to the log file and these variables added to
the environment; returns the process."""


class RouterError(RuntimeError):
    """A router is not installed, did not start, or refused a call (the message says which,
    with the end of its log)."""


def routers_dir() -> Path:
    """The virtualenv holding both routers (``$ENGINES_DIR/routers``, ``.engines/routers``)."""
    engines = Path(os.environ.get("ENGINES_DIR", ROOT / ".engines"))
    return (engines if engines.is_absolute() else ROOT / engines) / "routers"


def installed() -> bool:
    return (routers_dir() / ".installed").exists()


def router_binary(kind: str) -> Path:
    """The executable of ``kind``; ``RouterError`` when the routers are not installed."""
    if kind not in KINDS:
        raise RouterError(f"unknown router {kind!r} (one of {', '.join(KINDS)})")
    if not installed():
        raise RouterError("the routers are not installed: run scripts/engines.sh routers")
    return routers_dir() / "bin" / kind


def free_port() -> int:
    """A loopback port that was free a moment ago (for programs that cannot bind port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class RouterProcess:
    """A router process in front of ``workers`` (the URLs it was started with)."""

    kind: str
    proc: subprocess.Popen[Any]
    url: str
    log: Path
    workers: list[str] = field(default_factory=list)

    def log_tail(self) -> str:
        return log_tail(self.log)

    def listed(self) -> dict[str, str]:
        """Every worker the router lists, by URL: smg its ``status`` (``ready``,
        ``draining``, ``pending``, ...), vllm-router ``listed`` (it has no states); empty
        when the router does not answer."""
        if self.kind == "smg":
            body = get_json(f"{self.url}/workers")
            return {str(w["url"]).rstrip("/"): str(w.get("status"))
                    for w in (body or {}).get("workers", [])}
        body = get_json(f"{self.url}/list_workers")
        return {str(u).rstrip("/"): "listed" for u in (body or {}).get("urls", [])}

    def routes_to(self, worker: str) -> bool:
        """The router picks ``worker`` for new requests (smg ``ready``, vllm-router listed)."""
        return self.listed().get(worker) in ("ready", "listed")

    def remove_worker(self, worker: str) -> None:
        """Take ``worker`` out through the router's own API, as an operator or a Kubernetes
        endpoint watcher would: smg ``DELETE /workers/{id}`` (the worker is ``draining`` at
        once, and leaves ``SMG_SETTLE_S`` later), vllm-router ``POST /remove_worker?url=``.
        Returns when the router answered."""
        http = looks.client()
        if self.kind == "smg":
            body = http.get(f"{self.url}/workers", timeout=CALL_TIMEOUT_S).json()
            ids = [w["id"] for w in body.get("workers", [])
                   if str(w["url"]).rstrip("/") == worker]
            if not ids:
                return
            path = f"{self.url}/workers/{quote(str(ids[0]), safe='')}"
            # A short settle, as the coordinator's adapter sets: smg adds the worker back
            # only once it left (its default is 5 s); routing stops at the DELETE anyway.
            http.patch(path, json={"health": {"drain_settle_secs": SMG_SETTLE_S}},
                       timeout=CALL_TIMEOUT_S)
            answer = http.delete(path, timeout=CALL_TIMEOUT_S)
        else:
            answer = http.post(f"{self.url}/remove_worker", params={"url": worker},
                               timeout=CALL_TIMEOUT_S)
        if not answer.is_success and answer.status_code != 404:
            raise RouterError(f"{self.kind} refused to remove {worker}: "
                              f"{answer.status_code} {answer.text[:200]}")

    def add_worker(self, worker: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Add ``worker`` through the router's API and return once the router routes to it
        (smg registers it in the background after its probes: ~0.2 s). A worker smg still
        lists ``draining`` is waited for first: smg refuses to add it until it left."""
        wait_until(self, lambda: self.listed().get(worker) != "draining",
                   f"{worker} no longer draining", timeout_s)
        if self.kind == "smg":
            answer = looks.client().post(f"{self.url}/workers", json={"url": worker},
                                         timeout=ADD_TIMEOUT_S)
        else:
            answer = looks.client().post(f"{self.url}/add_worker", params={"url": worker},
                                         timeout=ADD_TIMEOUT_S)
        # smg 1.13 may answer 409 WORKER_CREATE_IN_PROGRESS (a registration already queued,
        # by a pod's coordinator joining it, say) and registers the worker all the same; a
        # worker already there (smg 409 ALREADY_EXISTS, vllm-router 400) is done too.
        queued = answer.status_code in (400, 409) and any(
            word in answer.text for word in ("IN_PROGRESS", "ALREADY_EXISTS", "already exists"))
        if not answer.is_success and not queued:
            raise RouterError(f"{self.kind} refused to add {worker}: "
                              f"{answer.status_code} {answer.text[:200]}")
        self.workers.append(worker)
        wait_until(self, lambda: self.routes_to(worker), f"{worker} routed", timeout_s)


def get_json(url: str) -> Any:
    try:
        response = looks.get(url, timeout=CALL_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def wait_until(router: RouterProcess, ready: Callable[[], bool], what: str,
               timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``ready`` until it holds; ``RouterError`` with the router's log when the router
    exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if router.proc.poll() is not None:
            raise RouterError(f"{router.kind} exited {router.proc.returncode} before {what}:\n"
                              f"{router.log_tail()}")
        if time.monotonic() > deadline:
            raise RouterError(f"timed out after {timeout_s:.0f}s waiting for {what}:\n"
                              f"{router.log_tail()}")
        time.sleep(POLL_S)


def router_argv(kind: str, port: int, workers: Sequence[str], *extra: str,
                health_check_interval_s: int | None = None,
                metrics_port: int | None = None) -> list[str]:
    """The command line of ``kind`` round robin on ``127.0.0.1:port`` in front of
    ``workers``, its metrics on loopback (smg's own default is ``0.0.0.0:29000``), debug
    logs (what each request was routed to), and ``extra`` flags last.

    ``health_check_interval_s``: the router's own health check of each worker (``GET
    /health``; both default to 60 s)."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
              "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
              "--prometheus-port", str(metrics_port or free_port()), "--log-level", "debug"]
    if health_check_interval_s is not None:
        common += ["--health-check-interval-secs", str(health_check_interval_s)]
    if kind == "smg":
        return [str(router_binary(kind)), "launch", *common,
                "--shutdown-grace-period-secs", str(SMG_SHUTDOWN_GRACE_S), *extra]
    return [str(router_binary(kind)), *common, *extra]


def start_router(kind: str, spawn: Spawn, workdir: Path, workers: Sequence[str], *extra: str,
                 port: int | None = None, health_check_interval_s: int | None = None,
                 timeout_s: float = START_TIMEOUT_S) -> RouterProcess:
    """Start ``kind`` (``smg`` or ``vllm-router``) in front of ``workers`` and return once it
    routes to every one of them:

    1. the command line (``router_argv``) on ``port`` (a free one when None), logging to
       ``workdir/<kind>-<port>.log``;
    2. wait until the router lists every worker as routable: smg probes each one first
       (``/health``, then ``/v1/models`` and the SGLang info calls to detect the backend)
       and lists it ``ready``; vllm-router checks every ``/health`` before it listens, so
       ``/list_workers`` naming them all means ready.
    """
    port = port or free_port()
    log = workdir / f"{kind}-{port}.log"
    argv = router_argv(kind, port, workers, *extra, health_check_interval_s=health_check_interval_s)
    proc = spawn(argv, log, {"NO_COLOR": "1"})
    router = RouterProcess(kind, proc, f"http://127.0.0.1:{port}", log, list(workers))
    wanted = {w.rstrip("/") for w in workers}
    wait_until(router, lambda: wanted <= {u for u, s in router.listed().items()
                                          if s in ("ready", "listed")},
               f"{kind} routing to {len(wanted)} workers", timeout_s)
    return router


def stop_router(router: RouterProcess, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM, wait up to ``timeout_s``, SIGKILL if it is still there; its exit code (both
    exit 0 on SIGTERM)."""
    if router.proc.poll() is None:
        router.proc.send_signal(signal.SIGTERM)
        try:
            return router.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            router.proc.kill()
    return router.proc.wait()


# --- a streaming load through a router ------------------------------------------------------

@dataclass
class SentStream:
    """One streaming completion the load sent, and what came back."""

    request_id: str
    """Its ``X-Request-Id`` (both routers pass it on; the engine logs it)."""
    prompt: str
    max_tokens: int
    sent_at: float
    """Epoch seconds just before the request left: the router chose a worker after this."""
    tokens: list[str] = field(default_factory=list)
    end: str | None = None
    """``done`` ([DONE] came), ``handed_back`` (the engine's handed-back event came), ``error``
    (an HTTP status other than 200, an error event, a broken or cut stream); None while it
    runs."""
    handed_back: dict[str, Any] | None = None
    error: str | None = None
    ended_at: float | None = None

    def expected(self) -> list[str]:
        """The tokens the simulated engines produce for this request, in full."""
        return expected_tokens(self.prompt, self.max_tokens)

    @property
    def exact(self) -> bool:
        """Ended [DONE] with exactly the expected tokens."""
        return self.end == "done" and self.tokens == self.expected()

    @property
    def exact_prefix(self) -> bool:
        """Ended handed back after exactly the first ``tokens`` expected tokens, as many as
        the handed-back event says."""
        return (self.end == "handed_back" and self.handed_back is not None
                and self.handed_back.get("tokens") == len(self.tokens)
                and self.tokens == self.expected()[:len(self.tokens)])


class RouterLoad:
    """``clients`` streaming completions at a time through ``url``, each client sending its
    next one as soon as the last ended, until ``stop()``; every one is kept in ``sent``.

    Request ``i`` is ``X-Request-Id: {prefix}-{i}`` with its own prompt, so the engines'
    request logs say which engine took it."""

    def __init__(self, url: str, *, clients: int, max_tokens: int, prefix: str,
                 timeout_s: float = 60.0) -> None:
        self.url = url
        self.clients = clients
        self.max_tokens = max_tokens
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.sent: list[SentStream] = []
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Send nothing new; ``run`` returns once the streams in flight ended."""
        self._stopping.set()

    def ended(self) -> list[SentStream]:
        return [s for s in self.sent if s.end is not None]

    async def run(self) -> list[SentStream]:
        limits = httpx.Limits(max_connections=self.clients + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                     limits=limits) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))
        return self.sent

    async def _client(self, http: httpx.AsyncClient) -> None:
        while not self._stopping.is_set():
            i = len(self.sent)
            stream = SentStream(f"{self.prefix}-{i}", f"{self.prefix} prompt {i}: why drain",
                                self.max_tokens, time.time())
            self.sent.append(stream)
            await self._one(http, stream)
            stream.ended_at = time.time()

    async def _one(self, http: httpx.AsyncClient, stream: SentStream) -> None:
        body = {"model": "sim", "prompt": stream.prompt, "max_tokens": stream.max_tokens,
                "stream": True}
        try:
            async with http.stream("POST", f"{self.url}/v1/completions", json=body,
                                   headers={"X-Request-Id": stream.request_id}) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:200]
                    stream.end, stream.error = "error", f"HTTP {response.status_code}: {text}"
                    return
                async for event in sse.events(response.aiter_lines()):
                    if event == sse.DONE:
                        stream.end = "done"
                        return
                    if not isinstance(event, dict) or "error" in event:
                        stream.end, stream.error = "error", str(event)[:200]
                        return
                    if event.get("handed_back"):
                        stream.end, stream.handed_back = "handed_back", event
                        return
                    stream.tokens.append(sse.chunk_text(event))
            stream.end, stream.error = "error", "the stream ended without [DONE]"
        except httpx.HTTPError as exc:
            stream.end, stream.error = "error", repr(exc)[:200]
