"""Exceptions of the coordinator package.

    CoordinatorError
    ├── RefusedTarget        a PID that must never be signalled (PID 1, ourselves, an ancestor)
    ├── TargetNotFound       the PID does not exist (or is no longer the process it was)
    ├── RefusedCaller        without the token, a caller acting beyond what it could signal
    ├── DrainConflict        the request does not fit the drain's current phase
    └── LimitReached         a bounded collection is full (a 429 naming the setting)

"Already gone" during a kill is success, never an exception.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base class of every error this package raises on purpose."""


class RefusedTarget(CoordinatorError):
    """The PID is one the coordinator will never signal."""

    def __init__(self, pid: int, why: str) -> None:
        super().__init__(f"refusing to signal pid {pid}: {why}")
        self.pid = pid
        self.why = why


class TargetNotFound(CoordinatorError):
    """The PID does not exist, or its identity (start time) no longer matches."""

    def __init__(self, pid: int, why: str = "no such process") -> None:
        super().__init__(f"pid {pid}: {why}")
        self.pid = pid
        self.why = why


class RefusedCaller(CoordinatorError):
    """Without the token, a caller asked for something it could not do itself (a 403): act
    on a process it could not signal (``coordinator.service.reach``)."""


class DrainConflict(CoordinatorError):
    """The operation is not allowed in the drain's current phase."""


class LimitReached(CoordinatorError):
    """A request would grow a bounded collection past its limit; nothing was changed."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(detail)
        self.limit = limit
        """The setting that bounds it (``max_handoffs``, ``max_workers`` …)."""
