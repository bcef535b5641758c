"""The simulated engine's main process: HTTP/tokenizer role, owner of the children.

Startup, in order:

1. Write the end record (``cleanup: "not started"``); bind the listening socket.
2. Start the children from the main thread (PDEATHSIG is tied to the forking thread):
   ``--schedulers N`` schedulers and a detokenizer, or with ``--dp N`` a DP controller
   (which starts its own N schedulers) and a detokenizer. Wait until each reports up.
3. Start the child watchdog (armed unless ``--no-watchdog``).
4. Serve HTTP with uvicorn on the bound socket; once listening, write the ready file.

Requests are generated in one place, ``self.streams`` (``CompletionStreams``): handing
requests back on a drain is ``self.streams.hand_back_all()``. Signals are handled in one
place, ``handle_signal``:

- stock (default), like SGLang today: SIGKILL every descendant, then itself — the container
  exits 137 and no child runs its cleanup;
- ``--graceful-main``: stand the watchdog down, hand in-flight requests back, stop HTTP,
  SIGTERM the direct children, wait up to ``--child-timeout-s``, SIGKILL stragglers (and
  anything below them), run its own teardown, exit 0;
- ``--serve-open-streams-s S``: the engine's own graceful wait: stop accepting, serve every
  open stream to its end for up to S seconds, then stop the children as above, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import uvicorn
from starlette.routing import BaseRoute

from devstack.sim.child import child_args
from devstack.sim.errors import SimArgumentError, SimStartupError
from devstack.sim.http_app import build_app
from devstack.sim.knobs import EngineKnobs
from devstack.sim.linux import send_signal
from devstack.sim.openai_api import ServedModel
from devstack.sim.records import (
    CLEANUP_INTERRUPTED,
    RecordWriter,
    signal_name,
    write_json_atomically,
)
from devstack.sim.roles import EXIT_OK, EXIT_STARTUP_FAILED, Role, knob_matches
from devstack.sim.spawn import ChildSpec, StartedChild, spawn_children
from devstack.sim.streams import CompletionStreams
from devstack.sim.watchdog import ChildWatchdog

if TYPE_CHECKING:
    from worker_client import WorkerClient

HTTP_DRAIN_TIMEOUT_S = 5
"""How long uvicorn waits for open connections after the streams were handed back."""
REAP_BEFORE_DYING_S = 1.0
"""Bound on collecting SIGKILLed children's exit status before the main process kills itself."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the engine decides what a signal means)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_started()


class EngineMain:
    """The main process of the simulated engine."""

    def __init__(self, knobs: EngineKnobs, *, record_dir: Path, ready_file: Path | None) -> None:
        self.knobs = knobs
        self.record_dir = record_dir
        self.ready_file = ready_file
        self.streams = CompletionStreams(knobs.token_interval_ms / 1000.0,
                                         knobs.hold_after_tokens)
        self.record = RecordWriter(record_dir, Role.MAIN)
        self.children: list[StartedChild] = []
        self.watchdog: ChildWatchdog | None = None
        self.server: _Server | None = None
        self.port = 0
        self.shutting_down = False
        self._dying = False
        self.worker_client: WorkerClient | None = None

    # --- startup -------------------------------------------------------------------------

    def child_specs(self) -> list[ChildSpec]:
        k = self.knobs
        common = common_child_args(k, self.record_dir)
        specs: list[ChildSpec] = []
        if k.dp > 0:
            dp_args = ["--schedulers", str(k.dp), *common]
            if k.dp_no_propagate:
                dp_args.append("--no-propagate")
            specs.append(ChildSpec("dp_controller", tuple(dp_args)))
        else:
            specs += [
                ChildSpec("scheduler", ("--rank", str(rank), *common))
                for rank in range(k.schedulers)
            ]
        specs.append(ChildSpec("detokenizer", tuple(common)))
        return specs

    async def run(self) -> int:
        self.record.update(knobs=self.knobs.to_argv())
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.knobs.host, self.knobs.port))
        except OSError as exc:
            why = f"cannot listen on {self.knobs.host}:{self.knobs.port}: {exc.strerror}"
            print(why, file=sys.stderr)
            self.record.ended(EXIT_STARTUP_FAILED, cleanup=CLEANUP_INTERRUPTED, detail=why)
            return EXIT_STARTUP_FAILED
        sock.listen(2048)
        self.port = sock.getsockname()[1]
        if self.knobs.coordinator:
            self._connect_to_coordinator()
        # Installed before the children start: a signal that comes meanwhile is acted on
        # once the loop runs (inside serve), instead of killing this process outright.
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.handle_signal, signum)
        try:
            self.children = spawn_children(
                self.child_specs(), timeout_s=self.knobs.startup_timeout_s
            )
        except SimStartupError as exc:
            self.record.ended(EXIT_STARTUP_FAILED, cleanup=CLEANUP_INTERRUPTED, detail=str(exc))
            return EXIT_STARTUP_FAILED
        self.record.update(children=[c.pid for c in self.children])
        self.watchdog = ChildWatchdog(
            self.children,
            armed=self.knobs.watchdog,
            on_fire=self._watchdog_fired,
            on_exit=self._child_exited,
        )
        self.watchdog.start()
        await self.on_children_started()
        config = uvicorn.Config(
            build_app(self.streams, self, self.served_model(), self.extra_routes()),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=HTTP_DRAIN_TIMEOUT_S,
        )
        self.server = _Server(config, on_started=self._write_ready_file)
        await self.server.serve(sockets=[sock])
        code = await self._finish_graceful_shutdown()
        if self.worker_client is not None:
            self.worker_client.close()
        return code

    async def on_children_started(self) -> None:
        """Called once every child is up and watched, before HTTP serves (a subclass's hook:
        a multi-node leader connects to its rank 0 here)."""

    async def before_stopping_children(self) -> None:
        """Called on a graceful stop, once HTTP stopped, before the children get SIGTERM."""

    def extra_routes(self) -> list[BaseRoute]:
        """HTTP routes a subclass serves besides the engine's own."""
        return []

    def served_model(self) -> ServedModel:
        """How this engine describes itself to routers (``/server_info``, ``/v1/models``)."""
        k = self.knobs
        return ServedModel(tp_size=1 if k.dp > 0 else max(k.schedulers, 1),
                           dp_size=max(k.dp, 1), created=int(time.time()))

    def _connect_to_coordinator(self) -> None:
        # Imported here: the engine without --coordinator does not need worker_client.
        from devstack.sim.coordination import TrackedStreams, connect

        url = f"http://{self.knobs.host}:{self.port}"
        self.worker_client, _ = connect(
            self.knobs.coordinator, self.knobs.coordinator_token_file, url,
            self.stand_down_watchdog, lambda times: self.record.update(worker_client=times),
        )
        self.streams = TrackedStreams(self.streams.token_interval_s, self.worker_client,
                                      self.streams.hold_after_tokens)

    def processes(self) -> list[dict[str, Any]]:
        """Every process of the engine, this one first."""
        me = {"pid": os.getpid(), "role": Role.MAIN.value, "rank": None, "ppid": os.getppid()}
        return [me, *(p for child in self.children for p in child.processes)]

    def _write_ready_file(self) -> None:
        if self.ready_file is None:
            return
        url = f"http://{self.knobs.host}:{self.port}"
        write_json_atomically(
            self.ready_file,
            {"pid": os.getpid(), "port": self.port, "url": url, "processes": self.processes()},
        )

    # --- controls (HTTP and hooks) -------------------------------------------------------

    def stand_down_watchdog(self) -> bool:
        """Disarm the child watchdog, so stopping the children does not crash the engine.

        A drain's pre-kill hook calls this before the children are signalled.
        """
        if self.watchdog is not None:
            self.watchdog.stand_down()
            self.record.update(watchdog="stood_down")
        return True

    def health(self) -> dict[str, Any]:
        return {
            "status": "shutting_down" if self.shutting_down else "ok",
            "pid": os.getpid(),
            "inflight": len(self.streams.inflight),
            "handing_back": self.streams.handing_back,
            "completed": self.streams.completed,
            "handed_back": len(self.streams.handed_back),
            "watchdog": self.watchdog.state if self.watchdog else "off",
        }

    # --- shutdown ------------------------------------------------------------------------

    def handle_signal(self, signum: int) -> None:
        """What SIGTERM (or SIGINT) means for the main process."""
        self.record.signalled(signum)
        if knob_matches(self.knobs.ignore_sigterm, Role.MAIN) or self.shutting_down \
                or self._dying:  # the watchdog is killing the tree: its record stands
            return
        self.shutting_down = True
        if self.knobs.serve_open_streams_s > 0:
            self._serve_open_streams(signum)
            return
        if not self.knobs.graceful_main:
            self._kill_tree_and_self(f"stock shutdown on {signal_name(signum)}")
            return
        # Graceful: nothing below may turn into a crash, and no stream is cut silently.
        if self.watchdog is not None:
            self.watchdog.stand_down()
        self.record.cleanup_started(detail=f"graceful shutdown on {signal_name(signum)}")
        self.streams.hand_back_all()
        if self.server is not None:
            self.server.should_exit = True

    def _serve_open_streams(self, signum: int) -> None:
        """The engine's own graceful wait (``--serve-open-streams-s``): open streams run to
        their end, within the bound; then ``_finish_graceful_shutdown`` as for a graceful
        main process."""
        # 1. Child exits from here on are the shutdown's own, not a crash.
        if self.watchdog is not None:
            self.watchdog.stand_down()
        self.record.cleanup_started(
            detail=f"serving open streams to their end on {signal_name(signum)}")
        self.record.update(streams_open_at_signal=len(self.streams.inflight))
        # 2. Stop accepting; uvicorn waits up to the bound for the open responses, then
        #    cancels what is left (those streams are cut).
        if self.server is not None:
            self.server.config.timeout_graceful_shutdown = math.ceil(
                self.knobs.serve_open_streams_s)
            self.server.should_exit = True

    async def _finish_graceful_shutdown(self) -> int:
        # 0. What a subclass does first (a multi-node leader has rank 0 finish the group).
        await self.before_stopping_children()
        # 1. Graceful signal to the direct children (the DP controller stops its own); with
        #    ``sigkill_leftovers`` to the schedulers and DP controller only (SGLang's
        #    ShutdownReq), the rest SIGKILLed in 3.
        stopped = [c for c in self.children
                   if not self.knobs.sigkill_leftovers or c.role != Role.DETOKENIZER.value]
        pids = [c.pid for c in stopped]
        for pid in pids:
            send_signal(pid, signal.SIGTERM)
        # 2. Bounded wait; the watchdog thread reaps them as they go.
        assert self.watchdog is not None
        watchdog = self.watchdog
        stragglers = await asyncio.to_thread(watchdog.wait_exited, pids, self.knobs.child_timeout_s)
        # 3. SIGKILL stragglers and whatever is still below them (with ``sigkill_leftovers``,
        #    everything left: SGLang's kill_process_tree), then wait for them too.
        if stragglers or self.knobs.sigkill_leftovers:
            for proc in _descendants():
                send_signal(proc.pid, signal.SIGKILL)
            everyone = [c.pid for c in self.children]
            await asyncio.to_thread(watchdog.wait_exited, everyone, self.knobs.child_timeout_s)
        if self.knobs.sigkill_leftovers:
            self.record.update(engine_sigkilled=sorted(
                c.pid for c in self.children if c not in stopped))
        # 4. Own teardown, then exit 0.
        if self.knobs.teardown_s > 0:
            await asyncio.sleep(self.knobs.teardown_s)
        self.record.update(sigkilled_children=sorted(stragglers))
        self.record.ended(EXIT_OK)
        return EXIT_OK

    def _child_exited(self, child: StartedChild, exit_code: int | None) -> None:
        codes = dict(self.record.data.get("children_exit_codes") or {})
        codes[str(child.pid)] = exit_code
        self.record.update(children_exit_codes=codes)

    def _watchdog_fired(self, child: StartedChild, exit_code: int | None) -> None:
        self._kill_tree_and_self(f"watchdog: {child.role} {child.pid} exited with {exit_code}")

    def _kill_tree_and_self(self, why: str) -> None:
        """SIGKILL every descendant, then this process (SGLang's ``kill_process_tree``).

        Unlike SGLang it collects its direct children's exit status first (bounded), so no
        zombie is left for PID 1 to reap; what the children see is the same.
        """
        if self._dying:
            return
        self._dying = True
        self.record.ended(-signal.SIGKILL, cleanup=CLEANUP_INTERRUPTED, detail=why)
        for proc in _descendants():
            send_signal(proc.pid, signal.SIGKILL)
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=REAP_BEFORE_DYING_S)
        os.kill(os.getpid(), signal.SIGKILL)


def common_child_args(knobs: EngineKnobs, record_dir: Path) -> list[str]:
    """The arguments every child of the engine takes (``child.child_arg_parser``)."""
    return child_args(record_dir, knobs.teardown_s, knobs.child_timeout_s, knobs.ignore_sigterm,
                      knobs.fork_on_shutdown, knobs.daemonize)


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def parse_arguments(argv: list[str] | None, *, prog: str,
                    description: str) -> tuple[EngineKnobs, Path, Path | None]:
    """An engine's command line (``python -m devstack.sim``'s flags): its knobs, its record
    directory (made if missing) and its ready file; exits 2 with usage on a bad one."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--record-dir",
        required=True,
        type=Path,
        help="where every process writes <role>-<pid>.json, how it ended",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help='written once serving: {"pid", "port", "url", "processes"}',
    )
    EngineKnobs.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        knobs = EngineKnobs.from_namespace(args)
    except SimArgumentError as exc:
        parser.error(str(exc))
    args.record_dir.mkdir(parents=True, exist_ok=True)
    return knobs, args.record_dir, args.ready_file


def main(argv: list[str] | None = None) -> None:
    """``python -m devstack.sim``."""
    knobs, record_dir, ready_file = parse_arguments(
        argv, prog="python -m devstack.sim",
        description="A simulated multi-process inference engine (SGLang-shaped).")
    if knobs.nnodes > 1:  # one pod of a multi-node engine: the leader or a follower
        from devstack.sim.group.pod import run_pod

        sys.exit(run_pod(knobs, record_dir=record_dir, ready_file=ready_file))
    engine = EngineMain(knobs, record_dir=record_dir, ready_file=ready_file)
    sys.exit(asyncio.run(engine.run()))
