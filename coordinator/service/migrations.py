"""Handed-back requests waiting for a router to re-issue them.

Each appears in ``/status`` ``migrations`` until a router acknowledges it (``POST
/migrations/ack``) or the drain's budget ends (then it is counted ``expired``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Migration:
    """One handed-back request."""

    request_id: str
    worker: str
    worker_url: str | None
    tokens: int
    handed_back_at: float
    detail: Any = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MigrationBook:
    """Pending migrations and running totals."""

    def __init__(self) -> None:
        self.pending: dict[str, Migration] = {}
        self.handed_back = 0
        self.acked = 0
        self.expired = 0

    def add(self, worker: str, worker_url: str | None, request_id: str, tokens: int,
            detail: Any = None) -> bool:
        """Record a handoff; False when the same request was already pending."""
        if request_id in self.pending:
            return False
        self.pending[request_id] = Migration(request_id, worker, worker_url, tokens,
                                             time.time(), detail)
        self.handed_back += 1
        return True

    def ack(self, request_ids: list[str]) -> tuple[list[str], list[str]]:
        """Acknowledge re-issued requests; returns (acked, unknown)."""
        acked: list[str] = []
        unknown: list[str] = []
        for request_id in dict.fromkeys(request_ids):
            if self.pending.pop(request_id, None) is not None:
                acked.append(request_id)
            else:
                unknown.append(request_id)
        self.acked += len(acked)
        return acked, unknown

    def expire_all(self) -> int:
        """The budget ended: drop every pending migration; returns how many."""
        count = len(self.pending)
        self.pending.clear()
        self.expired += count
        return count

    def counts(self) -> dict[str, int]:
        return {"handed_back": self.handed_back, "acked": self.acked,
                "expired": self.expired, "pending": len(self.pending)}

    def to_record(self) -> dict[str, Any]:
        return {**self.counts(), "pending": [m.to_dict() for m in self.pending.values()]}

    def restore(self, data: dict[str, Any]) -> None:
        for item in data.get("pending", ()):
            migration = Migration(**item)
            self.pending[migration.request_id] = migration
        self.handed_back = int(data.get("handed_back", 0))
        self.acked = int(data.get("acked", 0))
        self.expired = int(data.get("expired", 0))
