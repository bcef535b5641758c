"""A follower's calls to its leader's coordinator (httpx, retried with tenacity).

Errors of this package, and the lower library's, translated in ``_call`` alone::

    CoordinatorError
    └── GroupError              anything between the members of a group
        ├── LeaderUnreachable   no answer (connection refused or reset, timeout, a 5xx):
        │                       worth trying again, and counted toward the leader's loss
        └── PeerRefused         the leader answered 4xx (the token, a body it refused):
                                trying the same call again will not help

Every call carries the bearer token all the group's coordinators share. What a follower
sends is phases and summaries: an index, a URL, a reason, its own processes' fates; never a
PID or pattern for the leader to act on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)
from tenacity.stop import stop_base

from coordinator.errors import CoordinatorError
from coordinator.tls import verify_for
from shutdown_wire import bearer_header_bytes

CONNECT_TIMEOUT_S = 2.0
"""A leader that does not accept a connection within this long is unreachable for now."""
CALL_TIMEOUT_S = 5.0
"""Every call but the long-poll answers within this long, or the leader is unreachable."""
POLL_SLACK_S = 5.0
"""A long-poll may take this much longer than the wait it asked for."""


class GroupError(CoordinatorError):
    """Base of the errors between the members of a group."""


class LeaderUnreachable(GroupError):
    """The leader's coordinator did not answer (or answered 5xx)."""


class PeerRefused(GroupError):
    """The leader answered 4xx; ``status`` and the message say why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the leader refused ({status}): {detail}")
        self.status = status


class stop_when(stop_base):
    """Stop retrying once ``done()`` is true (a tenacity stop, composable with ``|``)."""

    def __init__(self, done: Callable[[], bool]) -> None:
        self.done = done

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.done()


def retrying(bound_s: float, *, give_up: Callable[[], bool] = lambda: False,
             sleep: Callable[[float], Any] = asyncio.sleep) -> AsyncRetrying:
    """Retry a call while the leader is unreachable, for ``bound_s`` seconds at most or
    until ``give_up()``; backoff 0.1 s doubling to 1 s. ``sleep`` is injectable (tests)."""
    return AsyncRetrying(
        stop=stop_after_delay(bound_s) | stop_when(give_up),
        wait=wait_exponential(multiplier=0.1, max=1.0),
        retry=retry_if_exception_type(LeaderUnreachable),
        sleep=sleep,
        reraise=True,
    )


class LeaderClient:
    """The calls a follower makes to its leader."""

    def __init__(self, leader_url: str, token: str | None) -> None:
        # Imported here: httpx costs the coordinator ~5 MB of memory, which only a member of
        # a group (a follower) needs.
        import httpx

        self.leader_url = leader_url
        self._http = httpx.AsyncClient(
            base_url=leader_url, headers=bearer_header_bytes(token),
            timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            verify=verify_for(leader_url))

    def set_token(self, token: str) -> None:
        """Carry ``token`` from the next call on (the token file changed)."""
        self._http.headers.update(bearer_header_bytes(token))

    async def close(self) -> None:
        await self._http.aclose()

    async def announce(self, index: int, url: str | None) -> dict[str, Any]:
        """``POST /group/members``: this follower is member ``index``, reached at ``url``."""
        return await self._call("POST", "/group/members", json={"index": index, "url": url})

    async def forward_drain(self, index: int, reason: str) -> dict[str, Any]:
        """``POST /drain`` (not waiting): this member's drain starts the group's."""
        return await self._call("POST", "/drain", json={
            "wait": False, "reason": f"group: member {index} draining ({reason})"[:200]})

    async def watch(self, since: int | None, wait_s: float) -> dict[str, Any]:
        """``GET /group``: the leader's group document, once its generation passes
        ``since`` or after ``wait_s``."""
        params: dict[str, Any] = {"wait": wait_s}
        if since is not None:
            params["since"] = since
        return await self._call("GET", "/group", params=params,
                                read_s=wait_s + POLL_SLACK_S)

    async def report(self, index: int, report: dict[str, Any]) -> dict[str, Any]:
        """``POST /group/members/{index}/summary``: how this pod's drain ended."""
        return await self._call("POST", f"/group/members/{index}/summary", json=report)

    async def _call(self, method: str, path: str, *, json: Any = None,
                    params: dict[str, Any] | None = None,
                    read_s: float | None = None) -> dict[str, Any]:
        import httpx

        extra: dict[str, Any] = {}
        if read_s is not None:
            extra["timeout"] = httpx.Timeout(read_s, connect=CONNECT_TIMEOUT_S)
        try:
            response = await self._http.request(method, path, json=json, params=params,
                                                **extra)
        except httpx.HTTPError as exc:
            raise LeaderUnreachable(f"{self.leader_url}: {type(exc).__name__}: {exc}") \
                from exc
        if response.status_code >= 500:
            raise LeaderUnreachable(f"{self.leader_url}: {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise LeaderUnreachable(f"{self.leader_url}: an answer that is not JSON") from exc
        if response.status_code >= 400:
            detail = body.get("detail") if isinstance(body, dict) else body
            raise PeerRefused(response.status_code, str(detail)[:500])
        if not isinstance(body, dict):
            raise LeaderUnreachable(f"{self.leader_url}: an answer that is not an object")
        return body
