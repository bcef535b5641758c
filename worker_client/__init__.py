"""The engine side of shutdown-coordinator: register, follow the drain, hand requests back.

    client = WorkerClient("http://127.0.0.1:8787", role="worker", url="http://10.0.0.5:8000")
    client.start()                          # inside the engine's loop; registers in background
    install_graceful_shutdown(client)       # SIGTERM/SIGINT drain first, then the engine's own

    async with client.track(request_id) as req:
        async for token in req.stream(engine.generate(...)):
            yield token
    if req.handed_back:
        yield handed_back_event(req.request_id, req.tokens)   # the stream's last event

Only httpx and tenacity are needed; nothing here imports the coordinator, FastAPI or psutil.
``Tier`` and ``handed_back_event`` are the wire module's (``shutdown_wire``), shared with the
coordinator and ``router_client``.
"""

from shutdown_wire import Tier, handed_back_event
from worker_client._client import WorkerClient
from worker_client._registration import process_start_time
from worker_client._signals import GracefulShutdown, install_graceful_shutdown
from worker_client._tracking import Request, TrackScope
from worker_client.errors import CoordinatorRefused, HandedBack, WorkerClientError

__all__ = [
    "CoordinatorRefused",
    "GracefulShutdown",
    "HandedBack",
    "Request",
    "Tier",
    "TrackScope",
    "WorkerClient",
    "WorkerClientError",
    "handed_back_event",
    "install_graceful_shutdown",
    "process_start_time",
]
