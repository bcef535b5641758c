"""Handed-back requests waiting for a router to re-issue them.

Each appears in ``/status`` ``migrations`` until a router acknowledges it (``POST
/migrations/ack``) or the drain's budget ends (then it is counted ``expired``).

A router usually reads the handed-back event on the engine's stream, and so acknowledges,
before the worker's batched report reaches the coordinator. Such an early acknowledgement is
remembered (until the drain ends) and applied when the handoff arrives: the handoff is then
counted handed back and acknowledged at once, never listed as pending, and the router has
nothing to retry.

Both collections are bounded (``--max-handoffs``, ``--max-early-acks``): a report or an
acknowledgement that would grow one past its bound is refused whole (``LimitReached``, a 429
the caller retries once routers have acknowledged), never half applied, and nothing is
silently forgotten. While no drain runs, what waits longer than ``--expire-after`` expires
(``expire_before``): a pending handoff is then counted ``expired``, as at a budget's end.

Some engines sit behind a router of their own that migrates a stream by itself and never
talks to the coordinator (Dynamo's frontend re-issues a stream that ends without its final
frame). Their workers report such a handoff as ``"ack": "engine"``: it is counted handed back
and acknowledged at once (the engine's report is its acknowledgement), never listed as
pending, so the migrating phase does not wait for an acknowledgement that will never come.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from coordinator.errors import LimitReached

MAX_PENDING = 10_000
"""Default bound on pending handoffs: far above what one pod holds in flight."""
MAX_EARLY_ACKS = 10_000
"""Default bound on early acknowledgements: one per request a router re-issued before its
handoff was reported, far above one pod's burst."""

RESOLVED_KEPT = 10_000
"""Acknowledged or expired ids remembered, so a repeated ack answers ``unknown`` instead of
being taken for an early one."""

LOG_KEPT = 10_000
"""Handoff events remembered for the drain timeline (``log``), newest kept."""

Added = Literal["listed", "acked", "engine"]


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


@dataclass(frozen=True)
class AckResult:
    """What one ``POST /migrations/ack`` did with each id."""

    acked: list[str]
    """Pending migrations this call removed."""
    early: list[str]
    """Not reported yet: remembered, and applied when the handoff arrives."""
    unknown: list[str]
    """Already acknowledged or expired."""


class MigrationBook:
    """Pending migrations, early acknowledgements and running totals."""

    def __init__(self, max_pending: int = MAX_PENDING,
                 max_early: int = MAX_EARLY_ACKS) -> None:
        self.max_pending = max_pending
        self.max_early = max_early
        self.pending: dict[str, Migration] = {}
        self.early: dict[str, float] = {}
        """Early acknowledgements (request id → when), oldest first."""
        self.early_owners: dict[str, int] = {}
        """Of ``early``: those a non-root caller sent without the token (request id → its
        UID): each settles its handoff only if the reporting worker is one that UID could
        signal (``add``'s ``may_settle``)."""
        self._resolved: dict[str, None] = {}
        self.handed_back = 0
        self.acked = 0
        self.expired = 0
        self.engine = 0
        """Of ``acked``: handoffs the engine's own router migrated (never pending)."""
        self.log: deque[tuple[float, str, int]] = deque(maxlen=LOG_KEPT)
        """(epoch s, ``handed_back`` | ``acked`` | ``expired``, how many), as they happened:
        what ``GET /status/timeline`` draws. Not persisted."""

    def check_room(self, handoffs: list[tuple[str, bool]]) -> None:
        """Raise ``LimitReached`` when adding ``handoffs`` (request id, engine-migrated) would
        hold more than ``max_pending`` pending; nothing is changed either way."""
        # An early acknowledgement of a caller without the token may not settle its
        # handoff (``add``): counted as taking room.
        new = {request_id for request_id, engine in handoffs
               if not engine and request_id not in self.pending
               and (request_id not in self.early or request_id in self.early_owners)}
        if new and len(self.pending) + len(new) > self.max_pending:
            raise LimitReached(
                "max_handoffs", f"{len(self.pending)} handed-back requests wait for a router "
                f"and {len(new)} more would pass the limit of {self.max_pending} "
                "(--max-handoffs); retry once routers have acknowledged some")

    def add(self, worker: str, worker_url: str | None, request_id: str, tokens: int,
            detail: Any = None, *, engine_migrated: bool = False,
            may_settle: Callable[[int], bool] | None = None) -> Added | None:
        """Record a handoff: ``listed`` (pending), ``acked`` (an early ack settled it at
        once), ``engine`` (the engine's own router migrated it), or None when the same
        request was already pending. An early acknowledgement of a UID (``early_owners``)
        settles it only when ``may_settle(uid)`` says that UID reaches the worker; one that
        does not is dropped, and the handoff is listed."""
        if request_id in self.pending:
            return None
        owner = self.early_owners.pop(request_id, None)
        if owner is not None and not engine_migrated and (
                may_settle is None or not may_settle(owner)):
            self.early.pop(request_id, None)
        self.handed_back += 1
        now = time.time()
        self.log.append((now, "handed_back", 1))
        if engine_migrated:
            self.early.pop(request_id, None)
            self.engine += 1
            self.acked += 1
            self.log.append((now, "acked", 1))
            self._resolve(request_id)
            return "engine"
        if self.early.pop(request_id, None) is not None:
            self.acked += 1
            self.log.append((now, "acked", 1))
            self._resolve(request_id)
            return "acked"
        self.pending[request_id] = Migration(request_id, worker, worker_url, tokens,
                                             now, detail)
        return "listed"

    def ack(self, request_ids: list[str], owner: int | None = None) -> AckResult:
        """Acknowledge re-issued requests; ``LimitReached`` (nothing changed) when the early
        ones would hold more than ``max_early`` early acknowledgements. ``owner``: the UID
        of a caller without the token, kept with its early acknowledgements."""
        ids = list(dict.fromkeys(request_ids))
        new_early = sum(1 for request_id in ids if request_id not in self.pending
                        and request_id not in self._resolved and request_id not in self.early)
        if new_early and len(self.early) + new_early > self.max_early:
            raise LimitReached(
                "max_early_acks", f"{len(self.early)} acknowledgements wait for their "
                f"handoffs and {new_early} more would pass the limit of {self.max_early} "
                "(--max-early-acks); retry once the handoffs are reported")
        acked: list[str] = []
        early: list[str] = []
        unknown: list[str] = []
        for request_id in ids:
            if self.pending.pop(request_id, None) is not None:
                acked.append(request_id)
                self._resolve(request_id)
            elif request_id in self._resolved:
                unknown.append(request_id)
            else:
                early.append(request_id)
                self.early.pop(request_id, None)
                self.early[request_id] = time.time()
                if owner is None:
                    self.early_owners.pop(request_id, None)
                else:
                    self.early_owners[request_id] = owner
        self.acked += len(acked)
        if acked:
            self.log.append((time.time(), "acked", len(acked)))
        return AckResult(acked, early, unknown)

    def forget_early(self) -> None:
        """The drain ended: acknowledgements of handoffs that never came are dropped."""
        self.early.clear()
        self.early_owners.clear()

    def expire_before(self, cutoff: float) -> tuple[int, int]:
        """Expire pending handoffs and early acknowledgements older than ``cutoff`` (epoch
        s); returns (handoffs expired, early acknowledgements dropped). Both dicts are in
        arrival order, so the walk stops at the first young one."""
        old = []
        for request_id, migration in self.pending.items():
            if migration.handed_back_at >= cutoff:
                break
            old.append(request_id)
        for request_id in old:
            del self.pending[request_id]
            self._resolve(request_id)
        self.expired += len(old)
        if old:
            self.log.append((time.time(), "expired", len(old)))
        dropped = []
        for request_id, at in self.early.items():
            if at >= cutoff:
                break
            dropped.append(request_id)
        for request_id in dropped:
            del self.early[request_id]
            self.early_owners.pop(request_id, None)
        return len(old), len(dropped)

    def expire_all(self) -> int:
        """The budget ended: drop every pending migration; returns how many."""
        count = len(self.pending)
        for request_id in self.pending:
            self._resolve(request_id)
        self.pending.clear()
        self.early.clear()
        self.early_owners.clear()
        self.expired += count
        if count:
            self.log.append((time.time(), "expired", count))
        return count

    def _resolve(self, request_id: str) -> None:
        self._resolved[request_id] = None
        while len(self._resolved) > RESOLVED_KEPT:
            del self._resolved[next(iter(self._resolved))]

    def counts(self) -> dict[str, int]:
        return {"handed_back": self.handed_back, "acked": self.acked,
                "expired": self.expired, "pending": len(self.pending),
                "early_acks": len(self.early)}

    def to_record(self) -> dict[str, Any]:
        return {**self.counts(), "engine": self.engine,
                "pending": [m.to_dict() for m in self.pending.values()],
                "early": list(self.early.items()),
                **({"early_owners": dict(self.early_owners)} if self.early_owners else {})}

    def restore(self, data: dict[str, Any]) -> None:
        for item in data.get("pending", ()):
            migration = Migration(**item)
            self.pending[migration.request_id] = migration
        for request_id, at in data.get("early", ()):
            self.early[str(request_id)] = float(at)
        self.early_owners = {str(r): int(uid) for r, uid in data.get("early_owners", {}).items()
                             if r in self.early}
        self.handed_back = int(data.get("handed_back", 0))
        self.acked = int(data.get("acked", 0))
        self.expired = int(data.get("expired", 0))
        self.engine = int(data.get("engine", 0))
