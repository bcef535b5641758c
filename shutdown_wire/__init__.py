"""The wire contract of shutdown-coordinator: the strings and small JSON forms that the
coordinator, its engines (``worker_client``) and routers (``router_client``) must agree on.

    from shutdown_wire import DRAIN_PHASES, EVENT_DRAIN, bearer_header

    if status["phase"] in DRAIN_PHASES: ...        # GET /status, the hello event
    if event["type"] == EVENT_DRAIN: ...           # GET /workers/{id}/events
    httpx.Client(headers=bearer_header(token))     # every call but the probes and /metrics

One place for each fact: the coordinator's own enums (``coordinator.drain.phases.Phase``,
``coordinator.service.registry.WorkerState``) take their values from here, and the clients
compare with these names instead of spelling the strings. The values are the protocol
(docs/protocol.md): changing one breaks every engine and router already deployed.

Standard library only, and it imports nothing of this project, so both clients can use it
without the service (``tests/worker_client/test_imports.py``). ``tests/shutdown_wire`` checks
every value against what a real coordinator serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "AUTHORIZATION",
    "BEARER",
    "DRAIN_PHASES",
    "EVENT_ABORT",
    "EVENT_DRAIN",
    "EVENT_HELLO",
    "EVENT_PING",
    "EVENT_TERMINATE",
    "EVENT_TYPES",
    "HANDED_BACK",
    "PHASES",
    "PHASE_DONE",
    "PHASE_DRAINING",
    "PHASE_MIGRATING",
    "PHASE_SERVING",
    "PHASE_TERMINATING",
    "WORKER_DRAINED",
    "WORKER_DRAINING",
    "WORKER_EXITED",
    "WORKER_SERVING",
    "WORKER_STATES",
    "WORKER_TERMINATING",
    "Tier",
    "bearer_header",
    "bearer_header_bytes",
    "handed_back_event",
]

# -- the drain's phases: ``phase`` in /status, in the ``hello`` event and in the answer to a
#    registration. In order; see coordinator/drain/phases.py for the transitions.

PHASE_SERVING: Final = "serving"
"""Normal operation; ``/readyz`` answers 200."""
PHASE_DRAINING: Final = "draining"
"""A drain was requested: readiness fails, workers were told."""
PHASE_MIGRATING: Final = "migrating"
"""Workers hand back in-flight requests; routers acknowledge them."""
PHASE_TERMINATING: Final = "terminating"
"""The ordered graceful kill runs; no way back."""
PHASE_DONE: Final = "done"
"""Every registered process is gone; the summary is final."""

PHASES: Final = (PHASE_SERVING, PHASE_DRAINING, PHASE_MIGRATING, PHASE_TERMINATING, PHASE_DONE)
DRAIN_PHASES: Final = frozenset({PHASE_DRAINING, PHASE_MIGRATING, PHASE_TERMINATING, PHASE_DONE})
"""Every phase but ``serving``: a drain runs or has run to its end. The pod takes no new work,
and a worker that (re)connects in one of them must consider itself drained."""

# -- a worker's state: ``workers[].state`` in /status. Only ``serving`` takes new work.

WORKER_SERVING: Final = "serving"
"""Registered; takes new work."""
WORKER_DRAINING: Final = "draining"
"""Told to drain; may still hold in-flight requests."""
WORKER_DRAINED: Final = "drained"
"""Reported zero in-flight requests during a drain."""
WORKER_TERMINATING: Final = "terminating"
"""Told the kill is about to start."""
WORKER_EXITED: Final = "exited"
"""Its process is gone."""

WORKER_STATES: Final = (WORKER_SERVING, WORKER_DRAINING, WORKER_DRAINED, WORKER_TERMINATING,
                        WORKER_EXITED)

# -- events on a worker's stream, GET /workers/{id}/events (NDJSON): the ``type`` of each line.

EVENT_HELLO: Final = "hello"
"""First line of every stream: the worker's ``id``, the ``phase`` and ``generation``, and the
``doorbell`` pipe when the coordinator has one."""
EVENT_DRAIN: Final = "drain"
"""A drain started: ``reason``, ``started_at``, ``deadline_at``, ``migration_deadline_at``."""
EVENT_ABORT: Final = "abort"
"""The drain was aborted before ``terminating``: serve again."""
EVENT_TERMINATE: Final = "terminate"
"""The kill is next: run the pre-kill hooks, then report ``prekill_done``."""
EVENT_PING: Final = "ping"
"""Keep-alive; a stream that misses several is dead."""

EVENT_TYPES: Final = (EVENT_HELLO, EVENT_DRAIN, EVENT_ABORT, EVENT_TERMINATE, EVENT_PING)

# -- the handed-back event: the last event of a handed-back request's stream (engine → router).

HANDED_BACK: Final = "handed_back"
"""The key that marks the event (``true``); a router continues the request elsewhere."""


def handed_back_event(request_id: str, tokens: int) -> dict[str, Any]:
    """The last event of a handed-back request's stream, in place of ``[DONE]``: the router
    continues the request elsewhere after the ``tokens`` this worker streamed
    (docs/protocol.md)."""
    return {HANDED_BACK: True, "request_id": request_id, "tokens": tokens}


# -- a kill tier a worker declares, as written in ``POST /workers`` (``tiers``).


@dataclass(frozen=True)
class Tier:
    """A kill tier a worker declares for its own process tree (see the ordered kill).

    ``pattern`` (a regular expression on the command line) and ``roles`` choose the
    processes; ``signal`` is sent first (a name, ``SIGTERM`` by default), ``timeout_s`` bounds
    the wait before SIGKILL (the coordinator's tier timeout when None); ``include_root``
    signals the registered root in this tier's place, when the tier matches it, instead of
    last."""

    name: str
    pattern: str | None = None
    roles: tuple[str, ...] = ()
    signal: str = "SIGTERM"
    timeout_s: float | None = None
    include_root: bool = False

    def to_json(self) -> dict[str, Any]:
        """The tier as registration JSON: what is left at its default is left out."""
        out: dict[str, Any] = {"name": self.name, "signal": self.signal}
        if self.pattern is not None:
            out["pattern"] = self.pattern
        if self.roles:
            out["roles"] = list(self.roles)
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        if self.include_root:
            out["include_root"] = True
        return out


# -- authentication: with a token configured, every call but /healthz, /readyz and /metrics.

AUTHORIZATION: Final = "Authorization"
BEARER: Final = "Bearer"
"""The scheme; the coordinator compares it without regard to case."""


def bearer_header(token: str | None) -> dict[str, str]:
    """The headers that carry ``token`` (none without one), for a client that writes its
    headers as latin-1 (``http.client``, ``worker_client``): a token travels as its UTF-8
    bytes, so the value is those bytes as latin-1 text (an ASCII token is unchanged)."""
    if not token:
        return {}
    return {AUTHORIZATION: f"{BEARER} {token}".encode().decode("latin-1")}


def bearer_header_bytes(token: str | None) -> dict[bytes, bytes]:
    """The headers that carry ``token`` as UTF-8 bytes (none without one), for httpx, which
    takes only ASCII text as a header's value."""
    return {AUTHORIZATION.encode(): f"{BEARER} {token}".encode()} if token else {}
