"""The front end's side of the collective: the leader's main process asks rank 0 for steps.

Every stream waits for a step before each token (``CompletionStreams.step_gate``). The
streams that ask while no step is running share the next one, as an engine batches its
running requests into one forward pass: one step, one token for each. ``finish()`` stops
issuing steps, lets the running one complete, then has rank 0 finish the group.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from devstack.sim.errors import SimError

STATE_CONNECTING = "connecting"
STATE_STEPPING = "stepping"
"""Issuing a step whenever a stream waits for one."""
STATE_FINISHING = "finishing"
"""No new step; the running one completes, then rank 0 finishes the group."""
STATE_FINISHED = "finished"
STATE_BROKEN = "broken"
"""Rank 0 went away: every stream waiting for a step fails."""


class CollectiveBroken(SimError):
    """No step can be had: rank 0 is gone, or the group stopped stepping."""


class GroupStepper:
    """Asks rank 0 for steps over one connection, one at a time, in batches."""

    def __init__(self) -> None:
        self.state = STATE_CONNECTING
        self.steps = 0
        self.world_size = 0
        self.error = ""
        self.finish_answers: dict[str, str] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next: asyncio.Future[int] | None = None
        """The step the streams asking now will share (not issued yet)."""
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def connect(self, host: str, port: int) -> None:
        """Reach rank 0 (already listening: it reported ready) and say this is the driver."""
        self._reader, self._writer = await asyncio.open_connection(host, port)
        reply = await self._call({"op": "drive"}, "driving")
        self.world_size = int(reply["world_size"])
        self.state = STATE_STEPPING
        self._task = asyncio.create_task(self._issue_steps())

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "steps": self.steps, "world_size": self.world_size,
                "error": self.error, "finish": self.finish_answers}

    async def step(self) -> int:
        """Wait for the next step the group completes; returns its number."""
        if self.state != STATE_STEPPING:
            raise CollectiveBroken(self.error or f"the group is {self.state}")
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        self._wanted.set()
        # Shielded: a stream handed back mid-wait must not cancel the step the others share.
        return await asyncio.shield(self._next)

    async def finish(self) -> dict[str, Any]:
        """End the group cleanly.

        1. Stop issuing steps; streams that still ask get ``CollectiveBroken``.
        2. Let the running step complete.
        3. Tell rank 0 to finish the group, and wait for its answer (each rank's bye).
        """
        if self.state == STATE_STEPPING:
            self.state = STATE_FINISHING
            self._wanted.set()
            if self._task is not None:
                await self._task
            try:
                reply = await self._call({"op": "finish"}, "finished")
            except CollectiveBroken as exc:
                self._broken(str(exc))
            else:
                self.finish_answers = dict(reply["ranks"])
                self.state = STATE_FINISHED
        return self.status()

    async def _issue_steps(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            batch, self._next = self._next, None
            if self.state != STATE_STEPPING:
                if batch is not None:
                    batch.cancel()  # its streams are being handed back
                return
            if batch is None:
                continue
            try:
                reply = await self._call({"op": "step"}, "stepped")
            except CollectiveBroken as exc:
                self._broken(str(exc))
                _fail(batch, CollectiveBroken(self.error))
                return
            self.steps = int(reply["n"])
            batch.set_result(self.steps)

    async def _call(self, request: dict[str, Any], answer: str) -> dict[str, Any]:
        """Send one request to rank 0 and read its answer."""
        assert self._reader is not None
        assert self._writer is not None
        async with self._lock:
            try:
                self._writer.write(json.dumps(request).encode() + b"\n")
                await self._writer.drain()
                line = await self._reader.readline()
            except OSError as exc:
                raise CollectiveBroken(f"rank 0 is gone ({exc})") from exc
        if not line:
            raise CollectiveBroken("rank 0 closed the connection")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("op") != answer:
            raise CollectiveBroken(f"rank 0 answered {reply!r} to {request!r}")
        return reply

    def _broken(self, why: str) -> None:
        self.state = STATE_BROKEN
        self.error = why
        if self._next is not None:
            _fail(self._next, CollectiveBroken(why))
            self._next = None


def _fail(future: asyncio.Future[int], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # retrieved: the streams that waited got it; none may be left
