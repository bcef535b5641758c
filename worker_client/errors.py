"""Exceptions of the worker_client package.

Every exception the package raises derives from ``WorkerClientError``:

    WorkerClientError
    ├── InvalidSetting            an argument or environment setting out of range (a ValueError)
    ├── HandedBack                a tracked request was ended by a drain and handed back
    ├── ClientClosed              the client was closed before the call could finish
    ├── NotRegistered             a report with no registration to send it under
    └── CoordinatorError          something between this process and its coordinator
        ├── CoordinatorUnreachable    no answer: refused, reset, timed out, TLS failed
        │   └── StreamEnded           the event stream closed or fell silent: open it again
        ├── ProtocolError             an answer that is not the HTTP or JSON expected
        └── CoordinatorRefused        an error status (4xx, 5xx)
            └── WorkerUnknown         404 for this worker: the coordinator forgot it

Errors of the layer below (``OSError``, ``ssl.SSLError``, a malformed answer) are translated
in one place, ``worker_client._http.translated``, with ``raise ... from exc``.

The coordinator being absent or unreachable does not reach the engine: the client keeps
trying in the background and the engine keeps serving.
"""

from __future__ import annotations


class WorkerClientError(Exception):
    """Base class of every error this package raises."""


class InvalidSetting(WorkerClientError, ValueError):
    """A constructor argument or ``WORKER_CLIENT_*`` variable the client cannot use.

    Also a ValueError: it is one, and callers that caught ValueError keep working."""


class HandedBack(WorkerClientError):
    """The request's generation was ended by a drain; it is to be continued elsewhere."""

    def __init__(self, request_id: str | None, tokens: int) -> None:
        super().__init__(f"request {request_id} handed back after {tokens} tokens")
        self.request_id = request_id
        self.tokens = tokens


class ClientClosed(WorkerClientError):
    """The client was closed while the call (registration, say) was still being tried."""


class NotRegistered(WorkerClientError):
    """A report was due while the worker had no registration (it is kept and sent later)."""


class CoordinatorError(WorkerClientError):
    """Base class of what went wrong between this process and its coordinator."""


class CoordinatorUnreachable(CoordinatorError):
    """No answer: the connection was refused, reset or timed out, or TLS failed."""


class StreamEnded(CoordinatorUnreachable):
    """The event stream ended (coordinator restart or shutdown, no ping): open it again."""


class ProtocolError(CoordinatorError):
    """An answer that is not the HTTP/1.1 or JSON this client expects."""


class CoordinatorRefused(CoordinatorError):
    """The coordinator answered with an error status; ``status`` says which."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"coordinator refused the call ({status}): {detail}")
        self.status = status
        self.detail = detail


class WorkerUnknown(CoordinatorRefused):
    """404 for this worker: the coordinator restarted without its state; register again."""

    def __init__(self, detail: str = "unknown worker") -> None:
        super().__init__(404, detail)
