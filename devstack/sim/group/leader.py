"""The leader pod's main process: the simulated engine's front end over a group of ranks.

It is ``EngineMain`` (HTTP, streams, hand-back, the child watchdog, SIGTERM handling,
``--coordinator``) with three differences:

- its children are this pod's ranks (rank 0 first) and a detokenizer, not schedulers;
- every token waits for a step of the whole group (``GroupStepper``), so a rank that is gone
  anywhere stalls every stream, and a rank 0 that aborts crashes the front end through the
  watchdog (stock) as SGLang's does;
- ``POST /internal/group/finish``: what a group drain calls once the leader's requests are
  handed back. It stands the watchdog down, hands back whatever is still in flight, stops
  issuing steps, waits for the running one, and has rank 0 tell every rank to finish; each
  rank then exits 0 and each follower pod's main with it. The front end keeps answering
  (every request is handed back at once) until its own SIGTERM. ``GET /internal/group``
  shows the stepper's state.

On a graceful SIGTERM (``--graceful-main``) the ordinary path is made safe for the group:
streams are handed back first, then rank 0 finishes the group (``before_stopping_children``,
as SGLang's tokenizer sends ``ShutdownReq``), then the children that are left get SIGTERM.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devstack.sim.group.pod import rank_specs, world_size
from devstack.sim.group.protocol import parse_addr
from devstack.sim.group.stepper import GroupStepper
from devstack.sim.main_process import EngineMain, common_child_args
from devstack.sim.openai_api import ServedModel
from devstack.sim.spawn import ChildSpec


class GroupLeader(EngineMain):
    """``EngineMain`` for pod 0 of a multi-node group."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stepper = GroupStepper()

    def child_specs(self) -> list[ChildSpec]:
        common = common_child_args(self.knobs, self.record_dir)
        return [*rank_specs(self.knobs, self.record_dir), ChildSpec("detokenizer", tuple(common))]

    async def on_children_started(self) -> None:
        # Rank 0 reported ready: the group is formed and it listens for the front end.
        host, port = parse_addr(self.knobs.dist_init_addr)
        try:
            await self.stepper.connect(host, port)
        except OSError as exc:
            self._kill_tree_and_self(f"could not reach rank 0 at {host}:{port}: {exc}")
        self.streams.step_gate = self.stepper.step
        self.record.update(node_rank=0, world_size=world_size(self.knobs))

    async def before_stopping_children(self) -> None:
        # The graceful stop handed every stream back and stood the watchdog down already;
        # now rank 0 ends the group, as SGLang's tokenizer sends ShutdownReq before it
        # stops its schedulers. Then the base class SIGTERMs what is left.
        self.record.update(group=await self.stepper.finish())

    def extra_routes(self) -> list[BaseRoute]:
        async def group(request: Request) -> Response:
            return JSONResponse(self.stepper.status())

        async def finish(request: Request) -> Response:
            return JSONResponse(await self.finish_group())

        return [
            Route("/internal/group", group, methods=["GET"]),
            Route("/internal/group/finish", finish, methods=["POST"]),
        ]

    async def finish_group(self) -> dict[str, Any]:
        """End the group in the order that is safe for its collectives.

        1. Stand the watchdog down: rank 0 is about to exit on purpose.
        2. Hand back every stream in flight (and any new one at once).
        3. Stop issuing steps, let the running one complete, and have rank 0 tell every
           rank to finish (``GroupStepper.finish``).
        """
        self.stand_down_watchdog()
        self.streams.hand_back_all()
        status = await self.stepper.finish()
        self.record.update(group=status)
        return status

    def health(self) -> dict[str, Any]:
        return {**super().health(), "group": self.stepper.status()}

    def served_model(self) -> ServedModel:
        return replace(super().served_model(), tp_size=world_size(self.knobs))
