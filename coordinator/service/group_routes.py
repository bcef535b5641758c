"""The group's HTTP routes (docs/group.md), added only to a coordinator in a group.

    POST /group/members                    a follower announces itself {index, url}
    POST /group/members/{index}/summary    a follower's drain summary (its own processes)
    GET  /group?wait=S&since=G             the group document; long-polls like /status

Every body is bounded (counts, string lengths, finite numbers): hostile input gets a 422
like any other, and nothing in it names a process for this coordinator to signal. A call
meant for the leader that reaches a follower is a 409. Without the token, only a trusted
caller (root, or one from a trusted network) may announce or report (``reach``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from coordinator.errors import DrainConflict
from coordinator.group.leader import GroupInputError
from coordinator.group.membership import MAX_GROUP_SIZE
from coordinator.group.node import GroupNode
from coordinator.group.summary import MODE_GROUP, MODE_LOCAL, PodReport
from coordinator.kill.report import Fate
from coordinator.service import reach
from coordinator.service.fast_status import long_poll
from coordinator.service.models import Url
from coordinator.service.runtime import Coordinator

MAX_PROCESSES = 100_000
"""Processes one pod may report (a pod runs a few to a few hundred)."""
MAX_CAUSES = 1_000
PID_MAX = 2**22
Index = Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE - 1)]
Text = Annotated[str, Field(max_length=1000)]


class Body(BaseModel):
    """Strict JSON types, finite floats (``coordinator.service.models``)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="ignore", strict=True)


class MemberAnnounce(Body):
    """``POST /group/members``."""

    index: Index
    url: Annotated[Url, Field(pattern=r"^https?://")] | None = None


class ProcessFate(Body):
    """One process of a follower's summary."""

    pid: Annotated[int, Field(ge=1, le=PID_MAX)]
    name: Annotated[str, Field(max_length=256)] = ""
    role: Annotated[str, Field(max_length=64)] | None = None
    fate: Literal[tuple(f.value for f in Fate)]  # type: ignore[valid-type]
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None


class SummaryReport(Body):
    """``POST /group/members/{index}/summary``: how a follower's drain ended."""

    outcome: Annotated[str, Field(max_length=32)] | None = None
    mode: Literal["group", "local"] = "group"
    reason: Text | None = None
    causes: Annotated[list[Text], Field(max_length=MAX_CAUSES)] = Field(default_factory=list)
    processes: Annotated[list[ProcessFate], Field(max_length=MAX_PROCESSES)] = Field(
        default_factory=list)


def group_routes(coordinator: Coordinator, node: GroupNode, cap_s: float,
                 caller: Callable[[Request], reach.Caller]) -> APIRouter:
    """The routes above, for ``coordinator`` in the group ``node`` (``caller``: who makes a
    request)."""
    api = APIRouter()

    def leader() -> Any:
        if node.leader is None:
            raise DrainConflict(f"this coordinator is member {node.membership.index} of its "
                                f"group, not its leader ({node.membership.leader_url})")
        return node.leader

    def unfit(exc: GroupInputError) -> HTTPException:
        return HTTPException(status_code=422, detail=str(exc))

    @api.post("/group/members", responses={409: {"description": "not the leader"},
                                           422: {"description": "not a member"}})
    async def announce(request: Request, body: MemberAnnounce) -> dict[str, Any]:
        """A follower of this leader announces itself."""
        reach.check_trusted(caller(request), "announce a group member")
        try:
            entry = leader().announce(body.index, body.url)
        except GroupInputError as exc:
            raise unfit(exc) from exc
        return {"index": entry.index, "size": node.membership.size,
                "phase": coordinator.machine.phase.value,
                "generation": coordinator.machine.generation}

    @api.post("/group/members/{index}/summary", responses={
        409: {"description": "not the leader, or no group drain"},
        422: {"description": "not a member"}})
    async def summary(request: Request, index: Annotated[int, Path(ge=1, le=MAX_GROUP_SIZE - 1)],
                      body: SummaryReport) -> dict[str, Any]:
        """A follower's drain summary: its own processes' fates, never anything to act on."""
        reach.check_trusted(caller(request), "report a group member's summary")
        report = PodReport(index=index, outcome=body.outcome,
                           mode=MODE_LOCAL if body.mode == MODE_LOCAL else MODE_GROUP,
                           reason=body.reason, causes=tuple(body.causes),
                           processes=tuple(p.model_dump() for p in body.processes))
        try:
            leader().report(index, report, coordinator.controller.drain or
                            coordinator.controller.last, coordinator.machine.phase)
        except GroupInputError as exc:
            raise unfit(exc) from exc
        return {"index": index, "generation": coordinator.machine.generation}

    @api.get("/group", responses={429: {"description": "too many long-polls"}})
    async def group(wait: Annotated[float, Query(ge=0, le=86_400)] = 0.0,
                    since: Annotated[int | None, Query(ge=0, le=2**53)] = None,
                    ) -> dict[str, Any]:
        """The group as this coordinator knows it; ``?wait=S&since=G`` long-polls until
        ``generation`` > G (followers follow their leader's drain with it)."""
        await long_poll(coordinator, wait, since, cap_s)
        generation = coordinator.machine.generation
        if node.leader is not None:
            return node.leader_document(coordinator.instance, generation)
        return {"instance": coordinator.instance, "generation": generation,
                "phase": coordinator.machine.phase.value, **node.to_status()}

    return api
