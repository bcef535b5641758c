"""The simulated engine run as the engine an overlay deploys: under that engine's own command
line, and shaped like it on shutdown. For the overlays of engines that cannot run on this
machine (SGLang, TensorRT-LLM: CUDA only).

What makes it that engine, as far as the coordinator can tell:

1. Its root's command line is the overlay's engine command as the container runs it, so the
   coordinator finds it with the engine profile's adopt pattern and nothing else:
   ``python3 -m sglang.launch_server …`` runs a ``sglang/launch_server.py`` module shim put on
   ``PYTHONPATH``; ``trtllm-serve …`` runs a Python script of that name put first on ``PATH``,
   so the kernel shows ``<python> <dir>/trtllm-serve …``, as for the installed entry point.
   The engine's own ``--host``/``--port`` flags (moved onto loopback) are the sim's; its other
   flags (the model) are ignored; the sim's knobs come from the environment (``ENV``).
2. Its root shuts down as both engines' main processes do (``ServingMain``): on SIGTERM it
   stops accepting, serves every open stream to its end, stands its child watchdog down,
   stops its children and waits for them, and exits 0. SGLang 0.5.23: ``sigterm_watchdog``
   drains the open requests without a bound, stops its ``SubprocessWatchdog``, then stops the
   schedulers (``ShutdownReq``) and what is left (``kill_process_tree``), and the server
   exits (``managers/tokenizer_manager.py``). trtllm-serve: uvicorn with no
   ``timeout_graceful_shutdown`` waits for every open response, then the lifespan's
   ``generator.shutdown()`` joins the MPI workers (``serve/openai_server.py``).

The tree is the sim's (children with ``PR_SET_PDEATHSIG``, a watchdog that SIGKILLs the tree
when a child exits while armed): schedulers stand for SGLang's TP schedulers or TRT-LLM's MPI
workers.

One control for tests (``HeldStreams``): every stream longer than ``hold_at`` tokens stops
after its ``hold_at``-th token until the root gets SIGUSR1, then runs to its end; so a test
knows a stream is in flight at the moment it chooses, whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from devstack.sim.knobs import EngineKnobs
from devstack.sim.launcher import PopenLike
from devstack.sim.main_process import EngineMain
from devstack.sim.records import signal_name
from devstack.sim.streams import CompletionStreams, HandedBack, Token

REPO = Path(__file__).resolve().parents[2]
ENV = "SHAPED_ENGINE"
"""JSON ``{"sim_args": [...], "hold_at": N}``: the sim's own arguments (record directory,
ready file, knobs) and the token after which streams are held (0: never)."""
RELEASE = signal.SIGUSR1
"""Sent to the root: held streams run on to their end."""

_SHIM = '''"""{what} as its overlay runs it: the simulated engine in its shape
(tests/deploy/engine_shapes.py)."""
from tests.deploy.engine_shapes import main

main()
'''


class HeldStreams(CompletionStreams):
    """Streams that stop after ``hold_at`` tokens until ``release()``, then run to their end
    on the token clock (not handed back)."""

    def __init__(self, token_interval_s: float, hold_at: int) -> None:
        super().__init__(token_interval_s)
        self.hold_at = hold_at
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()

    async def generate(
        self, request_id: str, prompt: str, max_tokens: int
    ) -> AsyncIterator[Token | HandedBack]:
        # An async generator, declared as an iterator: closed with this one.
        events = cast(AsyncGenerator[Token | HandedBack, None],
                      super().generate(request_id, prompt, max_tokens))
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
                if (isinstance(event, Token) and not event.last
                        and event.index + 1 == self.hold_at):
                    await self.released.wait()


class ServingMain(EngineMain):
    """The root of SGLang or trtllm-serve on SIGTERM: every open stream served to its end,
    then the children stopped, exit 0 (see the module's docstring)."""

    streams: HeldStreams

    def __init__(self, knobs: EngineKnobs, *, record_dir: Path, ready_file: Path | None,
                 hold_at: int) -> None:
        super().__init__(knobs, record_dir=record_dir, ready_file=ready_file)
        self.streams = HeldStreams(knobs.token_interval_ms / 1000.0, hold_at)

    async def run(self) -> int:
        asyncio.get_running_loop().add_signal_handler(RELEASE, self.streams.release)
        return await super().run()

    def handle_signal(self, signum: int) -> None:
        self.record.signalled(signum)
        if self.shutting_down or self._dying:  # the watchdog is killing the tree: its record
            return
        self.shutting_down = True
        # 1. Child exits from here on are the shutdown's own, not a crash.
        if self.watchdog is not None:
            self.watchdog.stand_down()
        self.record.cleanup_started(detail=f"serving open streams to their end on "
                                           f"{signal_name(signum)}")
        self.record.update(streams_open_at_signal=len(self.streams.inflight))
        # 2. Stop accepting; wait for every open response without a bound. Then
        #    EngineMain.run stops the children, waits for them, and exits 0.
        if self.server is not None:
            self.server.config.timeout_graceful_shutdown = None
            self.server.should_exit = True


def main() -> None:
    """The shims' entry: the engine's own flags from the command line, the sim's from ``ENV``."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--host", default="127.0.0.1")
    own.add_argument("--port", type=int, default=0)
    flags, _ = own.parse_known_args(sys.argv[1:])
    config: dict[str, Any] = json.loads(os.environ[ENV])
    parser = argparse.ArgumentParser(prog="engine_shapes")
    parser.add_argument("--record-dir", required=True, type=Path)
    parser.add_argument("--ready-file", type=Path, default=None)
    EngineKnobs.add_arguments(parser)
    args = parser.parse_args([*config["sim_args"], "--host", flags.host,
                              "--port", str(flags.port)])
    knobs = EngineKnobs.from_namespace(args)
    args.record_dir.mkdir(parents=True, exist_ok=True)
    engine = ServingMain(knobs, record_dir=args.record_dir, ready_file=args.ready_file,
                         hold_at=int(config["hold_at"]))
    sys.exit(asyncio.run(engine.run()))


@dataclass(frozen=True)
class Installed:
    """Where a container command finds the simulated engine here."""

    argv: list[str]
    """What runs in place of the container's ``command`` (its ``args`` follow)."""
    env: dict[str, str]


def install(command: list[str], directory: Path) -> Installed:
    """Put the simulated engine where ``command`` (a container's exec-form command) finds its
    engine: a module for ``python3 -m MODULE``, an entry-point script for ``NAME``."""
    python_path = os.pathsep.join(p for p in (str(directory / "site"), str(REPO),
                                              os.environ.get("PYTHONPATH")) if p)
    if len(command) == 3 and command[0] in ("python", "python3") and command[1] == "-m":
        *packages, module = command[2].split(".")
        where = directory / "site"
        for package in packages:
            where = where / package
            where.mkdir(parents=True, exist_ok=True)
            (where / "__init__.py").touch()
        (where / f"{module}.py").write_text(_SHIM.format(what=" ".join(command)))
        return Installed([sys.executable, "-m", command[2]], {"PYTHONPATH": python_path})
    if len(command) == 1 and "/" not in command[0]:
        script = directory / "bin" / command[0]
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(f"#!{sys.executable}\n" + _SHIM.format(what=command[0]))
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        path = os.pathsep.join([str(script.parent), os.environ.get("PATH", os.defpath)])
        return Installed([command[0]], {"PATH": path, "PYTHONPATH": python_path})
    raise ValueError(f"no shim for the container command {command!r}")


def moved(args: list[str], host: str = "127.0.0.1", port: int = 0) -> list[str]:
    """A container's ``args`` with ``--host`` and ``--port`` (``--flag=value`` or ``--flag
    value``) moved onto this machine; everything else as rendered."""
    new = {"--host": host, "--port": str(port)}
    out: list[str] = []
    follows: str | None = None
    for arg in args:
        if follows is not None:
            out.append(new[follows])
            follows = None
            continue
        flag, eq, _ = arg.partition("=")
        if flag in new:
            if eq:
                out.append(f"{flag}={new[flag]}")
            else:
                out.append(arg)
                follows = flag
            continue
        out.append(arg)
    return out


def spawner(spawn: Callable[..., PopenLike], installed: Installed, engine_args: list[str],
            hold_at: int, **spawn_kwargs: Any) -> Callable[..., PopenLike]:
    """A ``spawn`` for ``devstack.sim.start_engine`` that starts the engine as the
    container command would: the sim's own arguments go to the shim through ``ENV``."""

    def start(argv: list[str], env: dict[str, str]) -> PopenLike:
        sim_args = argv[argv.index("devstack.sim") + 1:]
        config = json.dumps({"sim_args": sim_args, "hold_at": hold_at})
        full = {**env, **installed.env, ENV: config}
        return spawn([*installed.argv, *engine_args], env=full, **spawn_kwargs)

    return start
