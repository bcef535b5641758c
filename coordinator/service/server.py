"""Runs the coordinator on uvicorn, and stops it the way a sidecar must.

Shutdown on SIGTERM/SIGINT, as steps:

    1. the signal handler only records the signal;
    2. the server's loop (uvicorn's tick) sees it; while a drain runs it keeps serving, so
       the drain finishes within its budget and ``GET /drain`` callers get their summary;
    3. then the workers' event streams are closed, long-polls are answered, and uvicorn
       shuts down (listeners, connections, bounded wait), and the process exits 0.

A second SIGINT (or SIGQUIT) escalates: stop now, without waiting for the drain.

Stopped by SIGINT (Ctrl-C at a terminal), it says on stderr what goes on (the drain to its
end, or nothing) and how to stop it at once, and exits ``INTERRUPTED`` (130) rather than 0:
the exit every command of the CLI gives when interrupted (``coordinator/cli/ending.py``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Generator
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from coordinator import exit_codes, startup_check
from coordinator.drain import state_claim
from coordinator.drain.ports import Killer
from coordinator.files import replace_file
from coordinator.kill import procfs, safety
from coordinator.logfmt import logfmt
from coordinator.service.app import create_app
from coordinator.service.connections import guarded_protocol
from coordinator.service.posture import Posture
from coordinator.service.public_gate import PublicAddressGate
from coordinator.service.runtime import Coordinator
from coordinator.settings import Settings

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
SHUTDOWN_BOUND_S = 5
"""Seconds uvicorn waits for open connections after the drain is over."""
FD_LIMIT_WANTED = 65_536
"""Soft ``RLIMIT_NOFILE`` the coordinator raises itself to (never above the hard limit).
The kill holds one pidfd per process and the service one fd per connection: systemd's
default soft limit of 1,024 is reached by a pod of a thousand processes, or by a thousand
idle clients, and a kill must not be the thing that runs out."""


def _pick(module: str, fallback: str, preferred: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return preferred


class CoordinatorServer(uvicorn.Server):
    """uvicorn's server with a drain-aware stop."""

    def __init__(self, config: uvicorn.Config, coordinator: Coordinator) -> None:
        super().__init__(config)
        self.coordinator = coordinator
        self.stop_signals: list[int] = []
        self._told = False

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises captured signals after serving; a sidecar stopped on request
        # must exit 0 instead, so the handlers are ours and nothing is re-raised.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        collect_from_now_on()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        if self.force_exit:
            # Forced, uvicorn waits for no connection and skips the application's shutdown;
            # the coordinator's own still runs (it stops the drain task, writes the state
            # file a last time, removes its doorbell pipe): a forced stop leaves none of it.
            await self.lifespan.shutdown()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Only record: the loop acts on it in on_tick.
        self.stop_signals.append(sig)

    async def on_tick(self, counter: int) -> bool:
        if self.stop_signals and not self.should_exit:
            forced = signal.SIGQUIT in self.stop_signals or self.stop_signals.count(
                signal.SIGINT) > 1
            if self.stop_signals[:1] == [signal.SIGINT] and not self._told:
                self._told = True
                print(_interrupted_line(self.coordinator, forced), file=sys.stderr,
                      flush=True)
            if forced or not self.coordinator.controller.running:
                if forced:
                    self.force_exit = True
                self.begin_stop(f"signal {signal.Signals(self.stop_signals[0]).name}")
        return await super().on_tick(counter)

    def begin_stop(self, why: str) -> None:
        """Step 3 of the module docstring: close the workers' streams, answer long-polls,
        let uvicorn shut down."""
        log.info("stopping (%s)", why)
        self.coordinator.notifier.close_all()
        # Long-polls answer now (a new generation) instead of holding the shutdown for up
        # to their wait: uvicorn would wait SHUTDOWN_BOUND_S for them.
        self.coordinator.bump()
        self.should_exit = True


def _interrupted_line(coordinator: Coordinator, forced: bool) -> str:
    """The one line Ctrl-C gets: what goes on before the coordinator stops, and how to
    stop it at once."""
    controller = coordinator.controller
    if forced or not controller.running or controller.drain is None:
        return "interrupted: the coordinator stops"
    left = max(0.0, controller.drain.deadlines.deadline_at - controller.clock())
    return (f"interrupted: the running drain goes on to its end ({left:.0f} s of its budget "
            "left), then the coordinator stops; Ctrl-C again stops it now and leaves the "
            "drain unfinished")


def collect_from_now_on() -> None:
    """The garbage collector back on, once the server listens (``serve`` turns it off before
    its imports), with everything made so far frozen out of its reach.

    The start makes hundreds of thousands of long-lived objects (FastAPI's and pydantic's
    models, the routes): collecting while they are made finds nothing to free and cost 8 %
    of the start's CPU, which a new pod pays beside the engines serving on its node. Frozen,
    they are not scanned again by the collections the drain's work triggers."""
    gc.freeze()
    gc.enable()


def raise_fd_limit(wanted: int = FD_LIMIT_WANTED) -> int:
    """Raise the soft file descriptor limit towards ``wanted`` (up to the hard limit); returns
    the soft limit in force. A limit that cannot be changed is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the file descriptor limit from %d: %s", soft, exc)
            return soft
        return target
    return soft


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (so the real port is known before serving, even with port 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def listen(settings: Settings) -> list[socket.socket]:
    """The API's socket (``host``), then the public address's on the same port
    (``public_host``, ``public_gate``), when one is set."""
    sockets = [bind(settings.host, settings.port)]
    if settings.public_host is not None:
        port = sockets[0].getsockname()[1]
        try:
            sockets.append(bind(settings.public_host, port))
        except OSError:
            sockets[0].close()
            raise
    return sockets


def write_port_file(path: Path, host: str, port: int) -> None:
    """Tell whoever started us where we listen (written atomically)."""
    shown = f"[{host}]" if ":" in host else host
    data = {"host": host, "port": port, "url": f"http://{shown}:{port}", "pid": os.getpid()}
    replace_file(path, json.dumps(data).encode())


def build_server(settings: Settings, *, kill: Killer | None = None,
                 checked: Posture | None = None,
                 server_class: type[CoordinatorServer] = CoordinatorServer,
                 loop: str | None = None) -> CoordinatorServer:
    """The app wrapped in a ``server_class`` (not started); ``loop``: uvicorn's event loop
    (default uvloop where installed)."""
    app = create_app(settings, kill=kill, checked=checked)
    served: ASGIApp = app
    if settings.public_host is not None:
        served = PublicAddressGate(app, settings.public_host)
    config = uvicorn.Config(
        served,
        loop=loop or _pick("uvloop", "asyncio", "uvloop"),
        http=guarded_protocol(settings.max_connections, settings.read_timeout_s),
        log_level=settings.log_level,
        # uvicorn's records go through the root logger: one format for the whole log.
        log_config=None,
        access_log=settings.log_level in ("debug", "trace"),
        timeout_graceful_shutdown=SHUTDOWN_BOUND_S,
        lifespan="on",
        server_header=False,
    )
    return server_class(config, app.state.coordinator)


def prepare_process(settings: Settings) -> None:
    """What the process needs before it serves: its log, its file descriptor limit, and the
    readings a kill that runs out of descriptors falls back on."""
    logging.basicConfig(level=settings.log_level.upper().replace("TRACE", "DEBUG"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limit = raise_fd_limit()
    log.debug("file descriptor limit: %d", limit)
    # Read the coordinator's own ancestry and the boot time while fds are plenty: a kill
    # that runs out of descriptors falls back on these readings.
    safety.protected_pids()
    procfs.boot_time()


def claim_state_file(settings: Settings) -> state_claim.Claim | None:
    """The state file made this process's before anything reads it or listens
    (``StateFileRefused`` otherwise: another coordinator holds it, or another user could
    write it); None without a state file."""
    claimed = state_claim.claim(settings.state_file) if settings.state_file else None
    if claimed is not None and claimed.problem is not None:
        log.warning("state file %s is not locked: %s", settings.state_file, claimed.problem)
    return claimed


def announce(server: CoordinatorServer, settings: Settings, port: int, *,
             to_stdout: bool = True) -> None:
    """Log the posture and the effective settings, write the port file, say where it
    listens (on stdout, or in the log where stdout is the engine's)."""
    posture = server.coordinator.posture
    log.log(logging.WARNING if posture.unauthenticated_network else logging.INFO,
            "%s", posture.summary())
    log.info("settings: %s", logfmt(startup_check.effective(settings)))
    for warning in startup_check.warnings(settings, os.environ):
        log.warning("%s", warning)
    if settings.port_file is not None:
        write_port_file(settings.port_file, settings.host, port)
    if settings.public_host is not None:
        shown = f"[{settings.public_host}]" if ":" in settings.public_host \
            else settings.public_host
        log.info("/healthz, /readyz and /metrics also on http://%s:%d", shown, port)
    where = f"shutdown-coordinator listening on http://{settings.host}:{port}"
    if to_stdout:
        print(where, flush=True)
    else:
        log.info("%s", where)


def serve(settings: Settings, *, kill: Killer | None = None,
          checked: Posture | None = None) -> int:
    """Run until stopped; returns the process exit code (0 on a requested stop)."""
    prepare_process(settings)
    claimed = claim_state_file(settings)
    sockets = listen(settings)
    port = sockets[0].getsockname()[1]
    server = build_server(settings, kill=kill, checked=checked)
    announce(server, settings, port)
    server.run(sockets=sockets)
    if claimed is not None:
        claimed.release()
    if server.stop_signals[:1] == [signal.SIGINT]:
        return exit_codes.INTERRUPTED
    return exit_codes.OK if server.started or server.stop_signals else 1
