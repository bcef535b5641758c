"""The router side of shutdown-coordinator: watch coordinators, continue handed-back requests.

    watcher = Watcher({"http://10.0.0.5:8000": "http://10.0.0.5:8787"})
    watcher.start()                                  # inside the router's loop
    watcher.is_draining("http://10.0.0.5:8000")      # stop routing new work there
    watcher.handed_back("req-42")                    # the pending Migration, or None
    await watcher.ack(["req-42"])                    # after re-issuing it elsewhere

    HandedBack.from_event(event)                     # an engine stream's last event, or None

    client = ContinuingClient("http://router:30000", coordinators=[...])
    async for chunk in client.stream("/v1/completions", body): ...   # handed-back streams
                                                     # continued through the same router

What coordinators answer comes back as frozen dataclasses (``router_client.messages``:
``RouterStatus``, ``WorkerEntry``, ``Migration``, ``AckResult``, ...); a field they need that
is missing or mistyped is a ``MalformedAnswer``. The protocol's strings (phases, worker
states) are ``shutdown_wire``'s.

The reference router (``python -m devstack.reference_router``, outside this package) is built
on it; the protocol is in docs/protocol.md, the continuation layer (``ContinuingClient``, and
the proxy built on it, ``python -m continuation_proxy``) in docs/continuation.md. Only httpx
(the watcher, the acknowledgements), aiohttp (the continuation's upstream streams: its C
parser carries every token) and tenacity (retries) are needed; nothing here imports the
coordinator or devstack.
"""

from router_client.continuation import ContinuationStats, ContinuingClient
from router_client.errors import (
    InvalidRequest,
    MalformedAnswer,
    RouterClientError,
    StreamFailed,
    UpstreamRejected,
)
from router_client.messages import (
    AckResult,
    DrainInfo,
    HandedBack,
    Migration,
    MigrationCounts,
    RouterStatus,
    WorkerEntry,
)
from router_client.openai_requests import Refusal
from router_client.upstream import RetryPolicy
from router_client.watch import CoordinatorView, Watcher

__all__ = [
    "AckResult",
    "ContinuationStats",
    "ContinuingClient",
    "CoordinatorView",
    "DrainInfo",
    "HandedBack",
    "InvalidRequest",
    "MalformedAnswer",
    "Migration",
    "MigrationCounts",
    "Refusal",
    "RetryPolicy",
    "RouterClientError",
    "RouterStatus",
    "StreamFailed",
    "UpstreamRejected",
    "Watcher",
    "WorkerEntry",
]
