"""Exceptions of the worker_client package.

    WorkerClientError
    ├── HandedBack          a tracked request was ended by a drain and handed back
    └── CoordinatorRefused  the coordinator answered a call with a 4xx that retrying cannot fix

The coordinator being absent or unreachable is not an error: the engine keeps serving and the
client keeps trying in the background.
"""

from __future__ import annotations


class WorkerClientError(Exception):
    """Base class of every error this package raises on purpose."""


class HandedBack(WorkerClientError):
    """The request's generation was ended by a drain; it is to be continued elsewhere."""

    def __init__(self, request_id: str | None, tokens: int) -> None:
        super().__init__(f"request {request_id} handed back after {tokens} tokens")
        self.request_id = request_id
        self.tokens = tokens


class CoordinatorRefused(WorkerClientError):
    """A 4xx answer (bad token, invalid body) that retrying cannot fix."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"coordinator refused the call ({status}): {detail}")
        self.status = status
        self.detail = detail
