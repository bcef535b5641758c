"""What a router reads from coordinators and engines, as frozen dataclasses: the one place
where their JSON is parsed.

    RouterStatus      GET /status?view=router (the full /status parses too: it has more)
    ├── DrainInfo         its ``drain`` (None while serving)
    ├── WorkerEntry       each of its ``workers``
    ├── Migration         each of its ``migrations``: a handed-back request no router has
    │                     acknowledged yet
    ├── MigrationCounts   its ``migration_counts``
    └── StreamEndingInfo  its ``stream_ending`` (``--end-streams``; None without)
    AckResult         POST /migrations/ack
    HandedBack        the last event of a handed-back stream (engine → router)

Each ``from_json`` ignores fields it does not know (a newer coordinator may add some) and
raises ``MalformedAnswer`` naming the field when one it needs is missing or of the wrong type.
The strings (phases, worker states, the handed-back key) are ``shutdown_wire``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import shutdown_wire as wire
from router_client.errors import MalformedAnswer


class _Fields:
    """Typed reads of one JSON object; ``where`` names it in errors (``/status workers[2]``)."""

    def __init__(self, document: object, where: str) -> None:
        if not isinstance(document, Mapping):
            raise MalformedAnswer(f"{where}: expected a JSON object, got {_kind(document)}")
        self.document: Mapping[str, Any] = document
        self.where = where

    def value(self, name: str) -> Any:
        try:
            return self.document[name]
        except KeyError:
            raise MalformedAnswer(f"{self.where}: missing field {name!r}") from None

    def wrong(self, name: str, expected: str, value: object) -> MalformedAnswer:
        return MalformedAnswer(
            f"{self.where}: field {name!r} should be {expected}, got {_kind(value)}")

    def text(self, name: str) -> str:
        value = self.value(name)
        if not isinstance(value, str):
            raise self.wrong(name, "a string", value)
        return value

    def text_or_none(self, name: str) -> str | None:
        return None if self.value(name) is None else self.text(name)

    def integer(self, name: str) -> int:
        value = self.value(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.wrong(name, "an integer", value)
        return value

    def integer_or_none(self, name: str) -> int | None:
        return None if self.value(name) is None else self.integer(name)

    def number(self, name: str) -> float:
        value = self.value(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.wrong(name, "a number", value)
        return float(value)

    def number_or_none(self, name: str) -> float | None:
        return None if self.value(name) is None else self.number(name)

    def flag(self, name: str) -> bool:
        value = self.value(name)
        if not isinstance(value, bool):
            raise self.wrong(name, "true or false", value)
        return value

    def array(self, name: str) -> list[Any]:
        value = self.value(name)
        if not isinstance(value, list):
            raise self.wrong(name, "a list", value)
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        values = self.array(name)
        for index, value in enumerate(values):
            if not isinstance(value, str):
                raise MalformedAnswer(
                    f"{self.where}: {name}[{index}] should be a string, got {_kind(value)}")
        return tuple(values)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


@dataclass(frozen=True)
class WorkerEntry:
    """One registered engine process as ``/status`` lists it (``workers[]``)."""

    id: str
    pid: int
    role: str
    url: str | None
    """Where it serves (what the router sends requests to); None when it did not say."""
    state: str
    """One of ``shutdown_wire.WORKER_STATES``; only ``serving`` takes new work."""
    inflight: int | None
    """Its last reported in-flight count; None before its first report."""
    handed_back: int
    connected: bool
    """Its event stream is open."""
    awaiting_report: bool
    """It heard of the drain and has not reported since: the migrating phase waits for it."""
    registered_at: float
    exited_at: float | None

    @property
    def takes_work(self) -> bool:
        return self.state == wire.WORKER_SERVING

    @classmethod
    def from_json(cls, document: object, where: str = "worker") -> WorkerEntry:
        f = _Fields(document, where)
        return cls(
            id=f.text("id"), pid=f.integer("pid"), role=f.text("role"), url=f.text_or_none("url"),
            state=f.text("state"), inflight=f.integer_or_none("inflight"),
            handed_back=f.integer("handed_back"), connected=f.flag("connected"),
            awaiting_report=f.flag("awaiting_report"), registered_at=f.number("registered_at"),
            exited_at=f.number_or_none("exited_at"),
        )


@dataclass(frozen=True)
class Migration:
    """A handed-back request no router has acknowledged yet (``migrations[]``)."""

    request_id: str
    worker: str
    """The id of the worker that handed it back."""
    worker_url: str | None
    tokens: int
    """Tokens that worker streamed before it handed the request back."""
    handed_back_at: float
    detail: str | dict[str, Any] | None = field(default=None, hash=False)
    """What the engine reported with it (a string or a JSON object), if anything."""

    @classmethod
    def from_json(cls, document: object, where: str = "migration") -> Migration:
        f = _Fields(document, where)
        detail = f.document.get("detail")
        if detail is not None and not isinstance(detail, str | dict):
            raise f.wrong("detail", "a string or an object", detail)
        return cls(
            request_id=f.text("request_id"), worker=f.text("worker"),
            worker_url=f.text_or_none("worker_url"), tokens=f.integer("tokens"),
            handed_back_at=f.number("handed_back_at"), detail=detail,
        )


@dataclass(frozen=True)
class DrainInfo:
    """The running drain (``drain`` in ``/status``)."""

    reason: str
    started_at: float
    deadline_at: float
    """When the drain's budget ends (epoch s): everything is stopped by then."""
    migration_deadline_at: float
    """When the migrating phase ends at the latest (epoch s)."""
    outcome: str | None
    """The verdict once ``done`` (``graceful``, ``killed``, ...), else None."""

    @classmethod
    def from_json(cls, document: object, where: str = "drain") -> DrainInfo:
        f = _Fields(document, where)
        return cls(
            reason=f.text("reason"), started_at=f.number("started_at"),
            deadline_at=f.number("deadline_at"),
            migration_deadline_at=f.number("migration_deadline_at"),
            outcome=f.text_or_none("outcome"),
        )


@dataclass(frozen=True)
class MigrationCounts:
    """Running totals of handed-back requests (``migration_counts``)."""

    handed_back: int
    acked: int
    expired: int
    """Dropped unacknowledged when a drain's budget ended."""
    pending: int
    early_acks: int

    @classmethod
    def from_json(cls, document: object, where: str = "migration_counts") -> MigrationCounts:
        f = _Fields(document, where)
        return cls(handed_back=f.integer("handed_back"), acked=f.integer("acked"),
                   expired=f.integer("expired"), pending=f.integer("pending"),
                   early_acks=f.integer("early_acks"))


@dataclass(frozen=True)
class StreamEndingInfo:
    """A drain ending its stock engine's streams for the proxy to continue
    (``stream_ending``, docs/protocol.md)."""

    state: str
    open: bool
    """The streams were ended and the coordinator takes ``continued`` acknowledgements now:
    an abort of one of its streams was the drain's."""
    ended: int
    continued: int

    @classmethod
    def from_json(cls, document: object, where: str = "stream_ending") -> StreamEndingInfo:
        f = _Fields(document, where)
        return cls(state=f.text("state"), open=f.flag("open"), ended=f.integer("ended"),
                   continued=f.integer("continued"))


@dataclass(frozen=True)
class RouterStatus:
    """One coordinator's ``/status`` as a router reads it."""

    phase: str
    """One of ``shutdown_wire.PHASES``."""
    generation: int
    """Moves on every change; ``?since=`` long-polls for the next one."""
    ready: bool
    drain: DrainInfo | None
    workers: tuple[WorkerEntry, ...]
    migrations: tuple[Migration, ...]
    migration_counts: MigrationCounts
    stream_ending: StreamEndingInfo | None = None
    """Absent from a coordinator without ``--end-streams`` (or older than it)."""

    @property
    def draining(self) -> bool:
        """The pod left ``serving``: it takes no new work."""
        return self.phase in wire.DRAIN_PHASES

    def workers_at(self, url: str) -> tuple[WorkerEntry, ...]:
        """The entries registered with this URL (an engine that restarted has an ``exited``
        one besides its new one, until the coordinator forgets it)."""
        wanted = url.rstrip("/")
        return tuple(w for w in self.workers if (w.url or "").rstrip("/") == wanted)

    def migration(self, request_id: str) -> Migration | None:
        return next((m for m in self.migrations if m.request_id == request_id), None)

    @classmethod
    def from_json(cls, document: object, where: str = "/status") -> RouterStatus:
        f = _Fields(document, where)
        drain = f.value("drain")
        return cls(
            phase=f.text("phase"), generation=f.integer("generation"), ready=f.flag("ready"),
            drain=None if drain is None else DrainInfo.from_json(drain, f"{where} drain"),
            workers=tuple(WorkerEntry.from_json(w, f"{where} workers[{i}]")
                          for i, w in enumerate(f.array("workers"))),
            migrations=tuple(Migration.from_json(m, f"{where} migrations[{i}]")
                             for i, m in enumerate(f.array("migrations"))),
            migration_counts=MigrationCounts.from_json(f.value("migration_counts"),
                                                       f"{where} migration_counts"),
            stream_ending=(None if f.document.get("stream_ending") is None else
                           StreamEndingInfo.from_json(f.document["stream_ending"],
                                                      f"{where} stream_ending")),
        )


@dataclass(frozen=True)
class AckResult:
    """What one ``POST /migrations/ack`` did with each id."""

    acked: tuple[str, ...]
    """Pending handoffs this call settled."""
    early: tuple[str, ...]
    """Not reported yet: remembered, and settled when the handoff arrives."""
    unknown: tuple[str, ...]
    """Already settled (acknowledged before, or expired), or never heard of."""
    continued: tuple[str, ...] = ()
    """Ended streams (``continued`` in the call) the coordinator counted as taken over."""

    @property
    def taken(self) -> tuple[str, ...]:
        """The ids the router is done with: ``acked`` and ``early``."""
        return (*self.acked, *self.early)

    @classmethod
    def from_json(cls, document: object, where: str = "/migrations/ack") -> AckResult:
        f = _Fields(document, where)
        return cls(acked=f.strings("acked"), early=f.strings("early"),
                   unknown=f.strings("unknown"),
                   continued=(f.strings("continued") if "continued" in f.document else ()))


@dataclass(frozen=True)
class HandedBack:
    """The handed-back event that ends an engine's stream in place of ``[DONE]``
    (``shutdown_wire.handed_back_event``): continue ``request_id`` elsewhere, after the
    ``tokens`` this worker streamed."""

    request_id: str
    tokens: int

    @classmethod
    def from_event(cls, event: object, where: str = "handed-back event") -> HandedBack | None:
        """The event as a ``HandedBack``, or None when it is not one (an ordinary chunk)."""
        if not isinstance(event, Mapping) or not event.get(wire.HANDED_BACK):
            return None
        f = _Fields(event, where)
        return cls(request_id=f.text("request_id"), tokens=f.integer("tokens"))
