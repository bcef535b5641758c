"""The engine side of shutdown-coordinator: register, follow the drain, hand requests back.

    client = WorkerClient("http://127.0.0.1:8787", role="worker", url="http://10.0.0.5:8000")
    client.start()                          # inside the engine's loop; registers in background
    install_graceful_shutdown(client)       # SIGTERM/SIGINT drain first, then the engine's own

    async with client.track(request_id) as req:
        async for token in req.stream(engine.generate(...)):
            yield token
    if req.handed_back:
        yield handed_back_event(req.request_id, req.tokens)   # the stream's last event

The standard library and tenacity are all it needs; nothing here imports the coordinator,
FastAPI, psutil or an HTTP library. ``Tier`` and ``handed_back_event`` are the wire module's
(``shutdown_wire``), shared with the coordinator and ``router_client``. Everything else is
in private modules, one job each:

    _client        WorkerClient: wires the parts below
    _link          registration, the event stream and reports, in a thread of its own
    _http          the one HTTP transport (a socket, TLS for https) and its error translation
    _events        the event stream, read on the engine's loop or in a thread
    _dispatch      what the coordinator's events and doorbell do here
    _drain         the drain as this process sees it; DrainNotice for observers
    _tracking      requests in flight, interrupted by a drain
    _reporter      batched reports
    _registration  what the worker registers, and its retries
    _retry         every retry policy (tenacity)
    _signals       SIGTERM/SIGINT: the drain before the engine's own handlers
    _doorbell, _scheduling, _prekill, _loop, _settings
"""

from shutdown_wire import Tier, handed_back_event
from worker_client._client import WorkerClient
from worker_client._drain import DrainNotice, DrainObserver
from worker_client._registration import process_start_time
from worker_client._signals import GracefulShutdown, install_graceful_shutdown
from worker_client._tracking import Request, TrackScope
from worker_client.errors import (
    ClientClosed,
    CoordinatorError,
    CoordinatorRefused,
    CoordinatorUnreachable,
    HandedBack,
    InvalidSetting,
    NotRegistered,
    ProtocolError,
    StreamEnded,
    WorkerClientError,
    WorkerUnknown,
)

__all__ = [
    "ClientClosed",
    "CoordinatorError",
    "CoordinatorRefused",
    "CoordinatorUnreachable",
    "DrainNotice",
    "DrainObserver",
    "GracefulShutdown",
    "HandedBack",
    "InvalidSetting",
    "NotRegistered",
    "ProtocolError",
    "Request",
    "StreamEnded",
    "Tier",
    "TrackScope",
    "WorkerClient",
    "WorkerClientError",
    "WorkerUnknown",
    "handed_back_event",
    "install_graceful_shutdown",
    "process_start_time",
]
