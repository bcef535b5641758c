"""The simulated engine with its request log: the engine of a pod the dev stack starts.

    python -m devstack.logged_engine --record-dir D [--ready-file F] [flags of devstack.sim]

The same engine as ``python -m devstack.sim``, every request it takes written to a
``RequestLog`` in its record directory (``devstack.sim.records.read_requests`` has the
fields), so tests and benchmarks can hold what clients saw against what the engines took.
``logged_argv`` turns the simulated engine's command into this one.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from devstack.sim.knobs import EngineKnobs
from devstack.sim.main_process import EngineMain, parse_arguments
from devstack.sim.records import RequestLog
from devstack.sim.streams import CompletionStreams, HandedBack, Token

MODULE = "devstack.logged_engine"


def logged_argv(argv: Sequence[str]) -> list[str]:
    """``[python, -m, devstack.sim, flags...]`` as this module's engine, the same flags."""
    return [argv[0], "-m", MODULE, *argv[3:]]


class LoggedEngine(EngineMain):
    """The simulated engine, every request it takes written to a ``RequestLog`` in its record
    directory: whatever streams the engine uses (its own, or a worker client's once it has
    connected to its coordinator) are wrapped as they are set."""

    def __init__(self, knobs: EngineKnobs, *, record_dir: Path, ready_file: Path | None) -> None:
        self._log = RequestLog(record_dir)  # before EngineMain sets its first streams
        super().__init__(knobs, record_dir=record_dir, ready_file=ready_file)

    @property
    def streams(self) -> CompletionStreams:
        return self._streams

    @streams.setter
    def streams(self, streams: CompletionStreams) -> None:
        # An instance attribute hides the method for the HTTP handlers; the streams' own
        # calls (a worker client's TrackedStreams calls super().generate) are not logged twice.
        setattr(streams, "generate", _logged(streams.generate, self._log))  # noqa: B010
        self._streams = streams


Generate = Callable[[str, str, int], AsyncIterator[Token | HandedBack]]


def _logged(generate: Generate, log: RequestLog) -> Generate:
    def logged(request_id: str, prompt: str, max_tokens: int) -> AsyncIterator[Token | HandedBack]:
        # Called by the handler the moment it has parsed the request: its arrival.
        serial = log.arrived(request_id, prompt, max_tokens)
        return _log_end(generate(request_id, prompt, max_tokens), log, serial)

    return logged


async def _log_end(events: AsyncIterator[Token | HandedBack], log: RequestLog,
                   serial: int) -> AsyncIterator[Token | HandedBack]:
    tokens, how = 0, "cut"
    try:
        async for event in events:
            if isinstance(event, HandedBack):
                how = "handed_back"
            else:
                tokens += 1
                if event.aborted:
                    how = "aborted"
            yield event
        how = "done" if how == "cut" else how
    finally:
        log.ended(serial, tokens, how)


def main(argv: list[str] | None = None) -> None:
    knobs, record_dir, ready_file = parse_arguments(
        argv, prog=f"python -m {MODULE}",
        description="The simulated engine (python -m devstack.sim) with its request log.")
    engine = LoggedEngine(knobs, record_dir=record_dir, ready_file=ready_file)
    sys.exit(asyncio.run(engine.run()))


if __name__ == "__main__":
    main()
