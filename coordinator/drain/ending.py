"""Ending a stock engine's streams for a continuing proxy: one step of the migrating phase.

An engine that does not hand requests back (stock SGLang, stock vLLM) is otherwise waited for:
the pod lives as long as its longest stream. With ``--end-streams`` the operator says that a
layer which continues a stream that ends early sits in front (the continuation proxy,
docs/continuation.md): once the routers took the pod out, its in-flight requests are ended
at once through the engine's own API (its profile's ``StreamEnder``), and the proxy continues
each one on another pod from what was streamed. Only the streams the proxy says it took over
are counted handed to it; the others were cut.

    waiting ──► ending ──► ended ──► closed
       │           │
       ├──► skipped└──► failed

    1. waiting  the migrating phase started: wait until every router adapter took the pod out
                (or has nothing to call); one that failed keeps the pod in a router, and a
                continuation could land on it again: the streams are then waited for as
                without the setting (``skipped``), never ended into the same pod;
    2. ending   the engine's count of requests in flight (its own gauges, the last read) is
                what is ended; with none in flight nothing is called (``skipped``); else the
                engine's API is called, once;
    3. ended    the engine answered: its streams end now, and the proxy continues them. Each
                stream the proxy took over is acknowledged (``POST /migrations/ack``
                ``continued``) while the window is open: until every ended stream is
                acknowledged, or ``ACK_WINDOW_S`` after the call, never past the migration
                deadline. ``failed``: the engine refused or did not answer: nothing was
                ended, the streams are waited for;
    4. closed   the counts are final: ``continued`` streams were handed to the proxy, the
                rest of ``ended`` (``cut``) were cut.

The state, its counts and the window are what ``/status`` shows under ``stream_ending``; the
proxy continues a stream that ended with ``finish_reason: "abort"`` only while a coordinator
it watches shows its window open (a client's own abort is passed on as it came). Pure and
clock-free: every call is given the time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class EndingState(enum.StrEnum):
    WAITING = "waiting"
    """For the routers to take the pod out."""
    ENDING = "ending"
    """The engine's API is being called."""
    ENDED = "ended"
    """The engine ended its streams; the proxy's acknowledgements are taken."""
    CLOSED = "closed"
    """The counts are final."""
    SKIPPED = "skipped"
    """Nothing was ended: nothing in flight, or a router still sends to the pod."""
    FAILED = "failed"
    """The engine did not end its streams; they are waited for."""


TRANSITIONS: dict[EndingState, dict[EndingState, str]] = {
    EndingState.WAITING: {EndingState.ENDING: "the routers took the pod out",
                          EndingState.SKIPPED: "a router still sends to the pod, or nothing "
                                               "is in flight"},
    EndingState.ENDING: {EndingState.ENDED: "the engine ended its streams",
                         EndingState.FAILED: "the engine did not end its streams"},
    EndingState.ENDED: {EndingState.CLOSED: "every ended stream acknowledged, or the window "
                                            "is over"},
    EndingState.CLOSED: {},
    EndingState.SKIPPED: {},
    EndingState.FAILED: {},
}
"""The only legal moves of the step, each with why it happens."""

FINAL = frozenset({EndingState.CLOSED, EndingState.SKIPPED, EndingState.FAILED})

ACK_WINDOW_S = 10.0
"""Seconds after the engine's answer during which the proxy's acknowledgements are taken:
the proxy learns of the window through its long-poll (milliseconds), then opens a
continuation, retried up to 10 s while the router refuses (``router_client.RetryPolicy``).
Cut to the migration deadline."""
MAX_CONTINUED = 10_000
"""Acknowledged stream ids remembered at most (far above what one pod holds in flight)."""


class IllegalEnding(RuntimeError):
    """A move ``TRANSITIONS`` does not allow."""


@dataclass
class StreamEnding:
    """One drain's ending of the engine's streams (see the module docstring)."""

    state: EndingState = EndingState.WAITING
    count: int | None = None
    """The engine's own count of its requests in flight when they were ended."""
    continued: dict[str, None] = field(default_factory=dict)
    """Ids of the proxy's upstream attempts it acknowledged as taken over, in order."""
    started_at: float | None = None
    """When the engine's API was called."""
    answered_at: float | None = None
    window_until: float | None = None
    """Acknowledgements are taken until then (epoch s)."""
    closed_at: float | None = None
    note: str = ""
    """Why it ended as it did (the router that failed, the engine's answer)."""

    def _move(self, to: EndingState, note: str = "") -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalEnding(f"cannot go from {self.state} to {to}")
        self.state = to
        if note:
            self.note = note

    # 1. and 2.
    def routers_out(self, inflight: int | None, now: float) -> bool:
        """Every router took the pod out: move to ``ending`` (True: call the engine now) or,
        with nothing in flight, to ``skipped``."""
        if not inflight:
            self._move(EndingState.SKIPPED, "nothing in flight" if inflight == 0 else
                       "the engine's in-flight count is not known")
            return False
        self.count = inflight
        self.started_at = now
        self._move(EndingState.ENDING)
        return True

    def router_kept(self, why: str) -> None:
        """A router did not take the pod out: nothing is ended (step 1)."""
        self._move(EndingState.SKIPPED, why)

    # 3.
    def answered(self, ok: bool, note: str, now: float, migration_deadline_at: float) -> None:
        """The engine's answer to the call."""
        self.answered_at = now
        if not ok:
            self.count = 0
            self._move(EndingState.FAILED, note)
            return
        self.window_until = min(now + ACK_WINDOW_S, migration_deadline_at)
        self._move(EndingState.ENDED, note)

    @property
    def open(self) -> bool:
        """Ended streams may be acknowledged now."""
        return self.state is EndingState.ENDED

    def acknowledge(self, request_ids: list[str], now: float) -> tuple[list[str], list[str]]:
        """The proxy took these streams over: (taken, refused). Refused once the window is
        closed, once as many as were ended were taken (a proxy that claims more than the
        engine ended cannot all be right), and ids already taken (nothing counts twice)."""
        taken: list[str] = []
        refused: list[str] = []
        for request_id in dict.fromkeys(request_ids):
            if (not self.open or request_id in self.continued
                    or len(self.continued) >= min(self.count or 0, MAX_CONTINUED)):
                refused.append(request_id)
                continue
            self.continued[request_id] = None
            taken.append(request_id)
        self.tick(now)
        return taken, refused

    def tick(self, now: float) -> None:
        """Close the window once everything ended is acknowledged or its time is over."""
        if self.state is EndingState.ENDED and (
                len(self.continued) >= (self.count or 0)
                or (self.window_until is not None and now >= self.window_until)):
            self.closed_at = now
            self._move(EndingState.CLOSED)

    @property
    def settled(self) -> bool:
        """The migrating phase need not wait for this step any longer."""
        return self.state in FINAL

    @property
    def ended(self) -> int:
        """Streams ended through the engine's API."""
        return (self.count or 0) if self.state in (EndingState.ENDED, EndingState.CLOSED) else 0

    @property
    def cut(self) -> int:
        """Streams ended that the proxy did not take over (final once ``closed``)."""
        return max(0, self.ended - len(self.continued))

    def to_status(self) -> dict[str, Any]:
        return {"state": self.state.value, "open": self.open, "ended": self.ended,
                "continued": len(self.continued), "cut": self.cut if self.settled else None,
                "started_at": self.started_at, "answered_at": self.answered_at,
                "window_until": self.window_until, "closed_at": self.closed_at,
                "note": self.note}

    def to_record(self) -> dict[str, Any]:
        return {"state": self.state.value, "count": self.count,
                "continued": list(self.continued), "started_at": self.started_at,
                "answered_at": self.answered_at, "window_until": self.window_until,
                "closed_at": self.closed_at, "note": self.note}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> StreamEnding:
        return cls(state=EndingState(data["state"]), count=data.get("count"),
                   continued=dict.fromkeys(str(i) for i in data.get("continued") or ()),
                   started_at=data.get("started_at"), answered_at=data.get("answered_at"),
                   window_until=data.get("window_until"), closed_at=data.get("closed_at"),
                   note=str(data.get("note") or ""))
