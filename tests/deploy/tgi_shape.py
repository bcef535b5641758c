"""text-generation-inference in its shape: what a coordinator with the ``tgi`` profile meets,
on a machine where TGI itself cannot run (CUDA only).

Three programs under TGI's names, each this module run by a Python interpreter that carries
the name (``install``): ``text-generation-launcher`` owns a ``text-generation-router`` and
one ``text-generation-server`` shard per rank, and they shut down as TGI v3.3.7's do (read
from its repository, git db931fc):

- the launcher (``launcher/src/main.rs``) starts the shards, each with
  ``Command::process_group(0)`` (a process group of its own, no PDEATHSIG, :1157), waits
  until each is up, then the router (its own group too, :1980). SIGTERM and SIGINT only
  clear its ``running`` flag (``ctrlc`` with its ``termination`` feature, :2225-2230 and
  ``launcher/Cargo.toml``). While running, a shard that exits, whatever its status (the
  shard manager reports it ``Failed``, :1209-1224), is ``Shard {rank} crashed`` and a
  router that exits is ``Webserver Crashed`` (:2333-2350): the launcher stops what is left
  as below and exits 1 (``main`` returns an error). Once ``running`` is clear it stops the
  router (``terminate``: SIGTERM, a wait bounded by ``--graceful-termination-timeout``,
  default 90 s, then SIGKILL, :2015-2036, 2352-2359), then every shard still running, all
  at once and each bounded the same way (``shutdown_shards``, :1228-1236, 1251-1260), and
  exits 0.
- the router (``router/src/server.rs``) serves the HTTP API and, on the same port, ``GET
  /metrics`` with the gauges ``tgi_batch_current_size`` and ``tgi_queue_size`` (:2042-2047,
  Prometheus text); on SIGTERM (axum's ``with_graceful_shutdown``, :2330, 2376-2400) it
  stops accepting and serves its open responses to their end, with no bound of its own,
  then exits 0.
- a shard (``server/text_generation_server/server.py``): SIGTERM or SIGINT clears
  ``KEEP_PROCESSING`` (:41-53), its serving loop ends (:310) and it exits 0.

What differs, and does not matter to the coordinator: the router streams the simulated
engine's tokens itself (``devstack.sim.http_app``; TGI's asks its shards over gRPC), a
shard's teardown stands for freeing its GPU (``teardown_s``), and the launcher waits on
pidfds where TGI's polls every 100 ms (so it notices an exit sooner, never later).

Each process writes its end record (``devstack.sim.records``: ``launcher-<pid>.json``,
``router-…``, ``shard-…``) when it is up, when its shutdown starts and when it ends; the
launcher's also holds its children's wait statuses (``children_exit_codes``), whom it
SIGKILLed (``sigkilled_children``), the order it signalled them (``stop_order``) and what it
called a crash (``detail``). Streams longer than ``hold_at`` tokens wait after their
``hold_at``-th token until the router gets SIGUSR1 (``engine_shapes.HeldStreams``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.sim.records import CLEANUP_FINISHED, RecordWriter, write_json_atomically
from devstack.sim.roles import Role
from devstack.sim.signals import SignalLatch

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.deploy.tgi_shape"
"""What each program runs (``-m``; in it, ``__name__`` is ``__main__``)."""
LAUNCHER = "text-generation-launcher"
ROUTER = "text-generation-router"
SHARD = "text-generation-server"
ENV = "TGI_SHAPE"
"""JSON: ``record_dir``, ``ready_file``, ``teardown_s``, ``hold_at``, ``token_interval_ms``
(what is the simulation's, not TGI's, so the command lines stay TGI's)."""
READY_FD_ENV = "TGI_SHAPE_READY_FD"
"""A child writes one JSON line there once it is up (where TGI's launcher waits for a shard's
socket file, or for the router's start)."""
RELEASE = signal.SIGUSR1
"""Sent to the router: held streams run on to their end."""
STARTUP_TIMEOUT_S = 60.0
"""Bounds a failed start only (a loaded 2-core machine starts Python slowly)."""
EXIT_CRASHED = 1
"""What TGI's launcher exits with when its ``main`` returns an error."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Shape:
    """The simulation's knobs, from ``ENV``."""

    record_dir: Path
    ready_file: Path | None = None
    teardown_s: float = 0.2
    """A shard's teardown after its signal (freeing its GPU); the router has none of its
    own once its last response ended."""
    hold_at: int = 0
    token_interval_ms: float = 20.0

    def to_env(self) -> str:
        return json.dumps({"record_dir": str(self.record_dir),
                           "ready_file": str(self.ready_file) if self.ready_file else None,
                           "teardown_s": self.teardown_s, "hold_at": self.hold_at,
                           "token_interval_ms": self.token_interval_ms})

    @classmethod
    def from_env(cls) -> Shape:
        data: dict[str, Any] = json.loads(os.environ[ENV])
        ready = data.get("ready_file")
        return cls(record_dir=Path(data["record_dir"]),
                   ready_file=Path(ready) if ready else None,
                   teardown_s=float(data["teardown_s"]), hold_at=int(data["hold_at"]),
                   token_interval_ms=float(data["token_interval_ms"]))


class Record(RecordWriter):
    """``devstack.sim.records``' end record, for a role of TGI's (``launcher``,
    ``router``, ``shard``): ``<role>-<pid>.json``, read by ``read_records``."""

    def __init__(self, record_dir: Path, role: str, *, rank: int | None = None) -> None:
        super().__init__(record_dir, Role.MAIN, rank=rank)
        self.path = Path(record_dir) / f"{role}-{os.getpid()}.json"
        self.data.update(role=role, program=Path(sys.orig_argv[0]).name,
                         pgid=os.getpgid(0))


def _stop_listening() -> None:
    """From here on SIGTERM and SIGINT do nothing to this process, as to TGI's programs once
    they began to stop (their handlers stay installed until they exit): blocked, so no
    default action can end it with a signal between its last record and its exit."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def _ready(info: dict[str, Any]) -> None:
    """Tell the launcher this child is up."""
    fd = int(os.environ.pop(READY_FD_ENV))
    os.write(fd, (json.dumps(info) + "\n").encode())
    os.close(fd)


# --- text-generation-launcher ------------------------------------------------------------


@dataclass
class _Child:
    popen: subprocess.Popen[bytes]
    role: str
    rank: int | None
    pidfd: int
    ready_fd: int

    @property
    def pid(self) -> int:
        return self.popen.pid


class _StartFailed(Exception):
    pass


class Launcher:
    """``text-generation-launcher`` (see the module's docstring)."""

    def __init__(self, argv: list[str], shape: Shape) -> None:
        parser = argparse.ArgumentParser(prog=LAUNCHER)
        parser.add_argument("--model-id", default="bigscience/bloom-560m")
        parser.add_argument("--hostname", default="0.0.0.0")
        parser.add_argument("--port", type=int, default=3000)
        parser.add_argument("--num-shard", type=int, default=1)
        parser.add_argument("-g", "--graceful-termination-timeout", type=float, default=90.0)
        parser.add_argument("--shard-uds-path", default="/tmp/text-generation-server")
        self.args, _ = parser.parse_known_args(argv)
        self.shape = shape
        self.timeout_s: float = self.args.graceful_termination_timeout
        self.latch = SignalLatch((signal.SIGTERM, signal.SIGINT))
        self.record = Record(shape.record_dir, "launcher")
        self.running = True
        self.shards: list[_Child] = []
        self.router: _Child | None = None
        self.stop_order: list[int] = []
        self.sigkilled: list[int] = []
        self.exit_codes: dict[str, int] = {}

    def log(self, message: str) -> None:
        print(f"{LAUNCHER}: {message}", file=sys.stderr, flush=True)

    def _take_signals(self) -> None:
        """``ctrlc``'s handler: a signal only clears ``running`` (noted in the record)."""
        for signum in self.latch.take():
            self.record.signalled(signum)
            self.running = False

    def _stopped(self) -> bool:
        self._take_signals()
        return not self.running

    # Startup.

    def _spawn(self, argv: list[str], role: str, rank: int | None,
               env: dict[str, str] | None = None) -> _Child:
        read_fd, write_fd = os.pipe()
        full = {**os.environ, **(env or {}), READY_FD_ENV: str(write_fd)}
        popen = subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL, pass_fds=(write_fd,),
                                 process_group=0)
        os.close(write_fd)
        return _Child(popen, role, rank, os.pidfd_open(popen.pid), read_fd)

    def _await_ready(self, child: _Child) -> dict[str, Any] | None:
        """The child's ready line; None when a signal cleared ``running`` first."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        line = b""
        while True:
            if self._stopped():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise _StartFailed(f"{child.role} {child.pid} not up after {STARTUP_TIMEOUT_S:g}s")
            readable = self.latch.wait((child.ready_fd, child.pidfd), left)
            if child.ready_fd in readable:
                chunk = os.read(child.ready_fd, 4096)
                line += chunk
                if line.endswith(b"\n"):
                    os.close(child.ready_fd)
                    info: dict[str, Any] = json.loads(line)
                    return info
                if chunk:
                    continue
            if child.pidfd in readable or child.ready_fd in readable:
                what = f"Shard {child.rank}" if child.role == "shard" else "Webserver"
                raise _StartFailed(f"{what} cannot start")

    def _start(self) -> int | None:
        """Shards first, each up, then the router; its port (None: stopped meanwhile)."""
        model = self.args.model_id
        world = self.args.num_shard
        for rank in range(world):
            argv = [SHARD, "-m", MODULE, "serve", model, "--uds-path",
                    self.args.shard_uds_path, "--logger-level", "INFO", "--json-output"]
            if world > 1:
                argv.append("--sharded")
            self.shards.append(self._spawn(argv, "shard", rank,
                                           {"RANK": str(rank), "WORLD_SIZE": str(world)}))
        for shard in self.shards:
            if self._await_ready(shard) is None:
                return None
        self.router = self._spawn(
            [ROUTER, "-m", MODULE, "--hostname", self.args.hostname,
             "--port", str(self.args.port), "--master-shard-uds-path",
             f"{self.args.shard_uds_path}-0", "--tokenizer-name", model], "router", None)
        info = self._await_ready(self.router)
        return None if info is None else int(info["port"])

    # Shutdown.

    def _wait_exits(self, children: list[_Child], timeout_s: float) -> list[_Child]:
        """Until each has exited or ``timeout_s`` passed (signals still noted); the rest."""
        deadline = time.monotonic() + timeout_s
        pending = list(children)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable = set(self.latch.wait(tuple(c.pidfd for c in pending), left))
            self._take_signals()
            pending = [c for c in pending if c.pidfd not in readable]
        return pending

    def _terminate(self, children: list[_Child]) -> None:
        """TGI's ``terminate`` for each of ``children`` at once: SIGTERM, a wait bounded by
        ``--graceful-termination-timeout``, SIGKILL; a child that already exited is not
        signalled (its shard manager saw it exit and returned)."""
        signalled: list[_Child] = []
        for child in children:
            if child.popen.poll() is not None:
                continue
            self.log(f"Terminating {child.role} {child.pid}")
            signal.pidfd_send_signal(child.pidfd, signal.SIGTERM)
            self.stop_order.append(child.pid)
            signalled.append(child)
        for child in self._wait_exits(signalled, self.timeout_s):
            self.log(f"Killing {child.role} {child.pid}")
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            self.sigkilled.append(child.pid)
        for child in children:
            self.exit_codes[str(child.pid)] = child.popen.wait()
        self.record.update(stop_order=self.stop_order, sigkilled_children=self.sigkilled,
                           children_exit_codes=self.exit_codes)

    def _watch(self) -> str | None:
        """The main loop: None once a signal cleared ``running``, else the crash (TGI's
        words) of the first child that exited."""
        assert self.router is not None
        fds = tuple(c.pidfd for c in (*self.shards, self.router))
        while True:
            if self._stopped():
                return None
            readable = self.latch.wait(fds)
            if self._stopped():  # a signal and an exit at once: the signal wins, as in TGI
                return None
            for shard in self.shards:
                if shard.pidfd in readable:
                    return f"Shard {shard.rank} crashed"
            if self.router.pidfd in readable:
                return "Webserver Crashed"

    def run(self) -> int:
        self.record.update(argv=sys.orig_argv)
        try:
            port = self._start()
        except _StartFailed as exc:
            self.log(str(exc))
            self._terminate([*self.shards, *([self.router] if self.router else [])])
            return self._exit(str(exc))
        crash: str | None = None
        if port is not None:
            assert self.router is not None
            processes = [{"pid": os.getpid(), "role": "launcher", "rank": None}] + [
                {"pid": c.pid, "role": c.role, "rank": c.rank}
                for c in (*self.shards, self.router)]
            self.record.update(children=[p["pid"] for p in processes[1:]])
            if self.shape.ready_file is not None:
                write_json_atomically(self.shape.ready_file, {
                    "pid": os.getpid(), "port": port,
                    "url": f"http://{self.args.hostname}:{port}", "processes": processes})
            crash = self._watch()
        if crash is None:
            self.record.cleanup_started(detail="stopping the router, then the shards")
        else:
            self.log(crash)
            self.record.cleanup_started(detail=crash)
        if self.router is not None:  # a router that crashed is only reaped
            self._terminate([self.router])
        self.log("Shutting down shards")
        self._terminate(self.shards)
        return self._exit(crash)

    def _exit(self, crash: str | None) -> int:
        """The last record, with every signal received; 0, or 1 after a crash."""
        _stop_listening()
        self._take_signals()
        for signum in sorted(signal.sigpending() & set(STOP_SIGNALS)):
            self.record.signalled(signum)
        if crash is None:
            self.record.ended(0, cleanup=CLEANUP_FINISHED)
            return 0
        failed = "WebserverFailed" if crash.startswith("Webserver") else "ShardFailed"
        self.log(f"Error: {failed}")
        self.record.ended(EXIT_CRASHED, cleanup=CLEANUP_FINISHED, detail=crash)
        return EXIT_CRASHED


# --- text-generation-router --------------------------------------------------------------


def tgi_gauges(batch: int, queue: int) -> str:
    """The router's in-flight gauges as its ``/metrics`` renders them
    (``metrics_exporter_prometheus``, described in ``router/src/server.rs``)."""
    lines: list[str] = []
    for name, text, value in (("tgi_batch_current_size", "Current batch size", batch),
                              ("tgi_queue_size", "Current queue size", queue)):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def run_router(argv: list[str], shape: Shape) -> int:
    """``text-generation-router``: streams until SIGTERM, then serves its open streams to
    their end and exits 0."""
    import asyncio
    import socket
    from collections.abc import Iterator
    from contextlib import contextmanager

    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from devstack.sim.http_app import PROMETHEUS_TEXT, build_app
    from tests.deploy.engine_shapes import HeldStreams

    parser = argparse.ArgumentParser(prog=ROUTER)
    parser.add_argument("--hostname", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=3000)
    args, _ = parser.parse_known_args(argv)
    record = Record(shape.record_dir, "router")

    class Controls:
        def stand_down_watchdog(self) -> bool:
            return False

        def health(self) -> dict[str, Any]:
            return {"status": "ok", "pid": os.getpid(), "inflight": len(streams.inflight)}

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling (the router's is below)."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                record.update(port=port)
                _ready({"port": port})

    async def metrics(request: Request) -> Response:
        return Response(tgi_gauges(len(streams.inflight), 0), media_type=PROMETHEUS_TEXT)

    def on_signal(signum: int) -> None:
        record.signalled(signum)
        if record.data["cleanup"] != "not started":
            return
        record.cleanup_started(detail="serving open streams to their end")
        record.update(streams_open_at_signal=len(streams.inflight))
        server.should_exit = True

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
        loop.add_signal_handler(RELEASE, streams.release)
        await server.serve(sockets=[sock])
        _stop_listening()
        record.ended(0)

    streams = HeldStreams(shape.token_interval_ms / 1000.0, shape.hold_at)
    app = build_app(streams, Controls())
    app.router.routes.insert(0, Route("/metrics", metrics, methods=["GET"]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.hostname, args.port))
    sock.listen(128)
    port = int(sock.getsockname()[1])
    record.update(argv=sys.orig_argv)
    # No bound on the wait for open responses: axum's graceful shutdown has none.
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                   timeout_graceful_shutdown=None))
    asyncio.run(serve())
    return 0


# --- text-generation-server (a shard) ----------------------------------------------------


def run_shard(shape: Shape) -> int:
    """``text-generation-server serve``: up until SIGTERM or SIGINT, then its teardown, exit 0.
    The signals are blocked and taken with ``sigwaitinfo``, so none is lost or fatal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    record = Record(shape.record_dir, "shard", rank=int(os.environ["RANK"]))
    record.update(argv=sys.orig_argv)
    _ready({"rank": record.data["rank"]})
    first = signal.sigwaitinfo(STOP_SIGNALS)
    record.signalled(first.si_signo)
    record.cleanup_started(
        detail=f"KEEP_PROCESSING cleared on {signal.Signals(first.si_signo).name}")
    deadline = time.monotonic() + shape.teardown_s
    while (left := deadline - time.monotonic()) > 0:  # its teardown; later signals noted
        info = signal.sigtimedwait(STOP_SIGNALS, left)
        if info is not None:
            record.signalled(info.si_signo)
    record.ended(0)
    return 0


def main() -> None:
    """Each program acts by the name it was started as."""
    program = Path(sys.orig_argv[0]).name
    shape = Shape.from_env()
    if program == LAUNCHER:
        code = Launcher(sys.argv[1:], shape).run()
    elif program == ROUTER:
        code = run_router(sys.argv[1:], shape)
    elif program == SHARD:
        code = run_shard(shape)
    else:
        raise SystemExit(f"start this as {LAUNCHER}, {ROUTER} or {SHARD}, not {program}")
    sys.exit(code)


# --- for tests ---------------------------------------------------------------------------


def install(directory: Path) -> dict[str, str]:
    """TGI's three programs in ``directory/bin``: symlinks to this Python interpreter, so a
    process's argv[0], its name and its command line are TGI's (``text-generation-launcher
    -m tests.deploy.tgi_shape --port …``); ``directory`` is laid out as this interpreter's
    virtual environment (Python looks for ``pyvenv.cfg`` beside the path it was started by,
    before it follows the symlink), so they import what this process imports. Returns the
    environment that finds them."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if sys.prefix != sys.base_prefix:
        shutil.copy(Path(sys.prefix) / "pyvenv.cfg", directory / "pyvenv.cfg")
        for key in ("purelib", "platlib"):
            site = Path(sysconfig.get_path(key))
            with_prefix = directory / site.relative_to(sys.prefix)
            if not with_prefix.exists():
                with_prefix.parent.mkdir(parents=True, exist_ok=True)
                with_prefix.symlink_to(site)
    for name in (LAUNCHER, ROUTER, SHARD):
        (bin_dir / name).symlink_to(sys.executable)
    return {"PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", os.defpath)]),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                          if p)}


@dataclass
class TgiEngine:
    """A running TGI shape, started by a test."""

    proc: subprocess.Popen[Any]
    """The launcher (the container's main process)."""
    record_dir: Path
    ready: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.ready["pid"])

    @property
    def port(self) -> int:
        return int(self.ready["port"])

    @property
    def url(self) -> str:
        return str(self.ready["url"])

    def pids(self, role: str | None = None) -> list[int]:
        return [p["pid"] for p in self.ready["processes"] if role in (None, p["role"])]

    def records(self) -> dict[int, dict[str, Any]]:
        from devstack.sim.records import read_records

        return {r["pid"]: r for r in read_records(self.record_dir)}


def start(spawn: Callable[..., subprocess.Popen[Any]], directory: Path, *, shards: int = 2,
          graceful_termination_timeout: float = 15.0, teardown_s: float = 0.2,
          hold_at: int = 0, token_interval_ms: float = 20.0,
          **spawn_kwargs: Any) -> TgiEngine:
    """Start ``text-generation-launcher --num-shard N`` as a container would (its router on a
    free loopback port) and return once it wrote its ready file."""
    env = install(directory / "tgi")
    record_dir = directory / "records"
    record_dir.mkdir(parents=True, exist_ok=True)
    ready_file = record_dir / "ready.json"
    shape = Shape(record_dir, ready_file, teardown_s, hold_at, token_interval_ms)
    proc = spawn([LAUNCHER, "-m", MODULE, "--model-id", "sim", "--hostname", "127.0.0.1",
                  "--port", "0", "--num-shard", str(shards),
                  "--graceful-termination-timeout", f"{graceful_termination_timeout:g}"],
                 env={**env, ENV: shape.to_env()}, **spawn_kwargs)
    from tests.support.processes import wait_for

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{LAUNCHER} exited {proc.returncode} before it was up")
        return ready_file.exists()

    wait_for(up, timeout=STARTUP_TIMEOUT_S, what=f"{LAUNCHER} up")
    return TgiEngine(proc, record_dir, json.loads(ready_file.read_text()))


if __name__ == "__main__":
    main()
