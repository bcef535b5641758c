"""``shutdown-coordinator run``: the coordinator as the engine's init, from start to exit.

    1. Become the subreaper of everything below (unless already PID 1, which is one).
    2. Claim the state file, bind the API's sockets (loopback; the public address, when set),
       none inherited by the engine; catch the stop signal and the forwarded ones (recorded
       until the event loop runs, then replayed).
    3. Start the engine as a child (``engine_child``), adopted by PID: the settings' own
       adoption (an ``--engine`` profile's patterns and tiers, registrations from
       ``worker_client`` inside it) applies to its tree, confined to what descends from here.
    4. Serve the coordinator's API as ``serve`` does, the engine's lifecycle
       (``supervisor.EngineInit``) running on the same loop: the loop's signal handlers only
       record and wake it, SIGCHLD reaps.
    5. Once it is DONE, stop serving as ``serve`` stops (streams closed, long-polls answered).
    6. Log the summary, last, and exit with the engine main process's own status.

Should the service fail to start, the engine is ended anyway (ordered, bounded) before
this process exits: an init never leaves its engine behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Generator, Sequence
from types import FrameType

from coordinator.engines import PROFILES
from coordinator.init import engine_child
from coordinator.init.lifecycle import forwarded
from coordinator.init.reaper import become_subreaper
from coordinator.init.supervisor import EngineInit
from coordinator.service.posture import Posture
from coordinator.service.server import (
    CoordinatorServer,
    announce,
    build_server,
    claim_state_file,
    listen,
    prepare_process,
)
from coordinator.settings import Settings

log = logging.getLogger(__name__)


class EarlySignals:
    """Step 2: record the signals that arrive before the event loop handles them."""

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = tuple(signals)
        self.received: list[int] = []
        for sig in self.signals:
            signal.signal(sig, self._record)

    def _record(self, sig: int, _frame: FrameType | None) -> None:
        self.received.append(sig)


class InitServer(CoordinatorServer):
    """The coordinator's server whose loop also runs the engine's lifecycle."""

    init: EngineInit
    early: EarlySignals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Step 4: handlers on the loop (they run between callbacks, never inside the kill
        # engine's or the registry's reading of an exit code).
        loop = asyncio.get_running_loop()
        handled = self.early.signals
        for sig in handled:
            loop.add_signal_handler(sig, self.init.signal_received, sig)
        loop.add_signal_handler(signal.SIGCHLD, self.init.reap)
        for sig in self.early.received:
            self.init.signal_received(sig)
        self.early.received.clear()
        self.init.reap()  # what exited before the handler was there
        try:
            yield
        finally:
            for sig in (*handled, signal.SIGCHLD):
                loop.remove_signal_handler(sig)
            for sig in handled:  # from here to the exit, nothing may end us by default
                signal.signal(sig, signal.SIG_IGN)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._lifecycle = asyncio.get_running_loop().create_task(
                self.init.run(self.coordinator), name="engine-init")

    async def on_tick(self, counter: int) -> bool:
        if self.init.done.is_set() and not self.should_exit:
            self.begin_stop("the engine has ended")
        return await super().on_tick(counter)


def run_engine(settings: Settings, argv: Sequence[str], *, stop_signal: int,
               checked: Posture | None = None) -> int:
    """Steps 1-6; returns the exit code (``engine_child.SpawnError`` when the command
    cannot start: nothing else has started then)."""
    prepare_process(settings)
    # Step 1.
    if os.getpid() != 1:
        try:
            become_subreaper()
        except OSError as exc:
            log.warning("not a subreaper (%s): orphans of the engine go to the host's init",
                        exc)
    # Step 2.
    claimed = claim_state_file(settings)
    sockets = listen(settings)
    for sock in sockets:
        sock.set_inheritable(False)
    port = sockets[0].getsockname()[1]
    early = EarlySignals((stop_signal, *forwarded(stop_signal)))
    # Step 3.
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    token_file = str(settings.token_file) if settings.token_file is not None else None
    defaults = [(name, value) for name, value in PROFILES[settings.engine].engine_env
                if name not in os.environ]
    env = engine_child.child_environment(os.environ, f"http://{shown}:{port}", token_file,
                                         defaults)
    child = engine_child.start(argv, env)
    log.info("engine started: pid %d: %s", child.pid, " ".join(argv))
    if defaults:
        log.info("engine environment from the %s profile (unset here): %s", settings.engine,
                 " ".join(f"{name}={value}" for name, value in defaults))
    settings = settings.model_copy(update={
        "adopt_pids": [*settings.adopt_pids, child.pid],
        "confine_to_pid": settings.confine_to_pid or os.getpid()})
    init = EngineInit(child, stop_signal, settings)
    try:
        # Step 4. asyncio's loop, not uvloop: uvloop keeps SIGCHLD for its own subprocesses
        # and refuses a handler for it, and reaping is this loop's job.
        server = build_server(settings, checked=checked, server_class=InitServer,
                              loop="asyncio")
        assert isinstance(server, InitServer)
        server.init, server.early = init, early
        announce(server, settings, port, to_stdout=False)  # stdout is the engine's
        server.run(sockets=sockets)
    finally:
        # Whatever stopped the service (it failed to start, a bug): never leave the engine.
        if not init.done.is_set():
            log.error("the coordinator's service stopped before the engine ended: ending it")
            asyncio.run(init.end_alone())
        if claimed is not None:
            claimed.release()
    # Step 6.
    summary = init.summary
    log.log(logging.INFO if summary.exit_code == 0 else logging.WARNING,
            "engine init end: %s", summary.line())
    return summary.exit_code
