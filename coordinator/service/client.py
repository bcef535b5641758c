"""A small synchronous client of the coordinator, for the ``drain`` and ``status`` commands."""

from __future__ import annotations

from typing import Any

import httpx

from coordinator.errors import CoordinatorError
from coordinator.service.render import shown
from shutdown_wire import bearer_header_bytes

LONG_POLL_S = 10.0


class ClientError(CoordinatorError):
    """The coordinator could not be reached or answered something unexpected."""


class AuthError(ClientError):
    """The coordinator refused the token."""


class RefusedError(ClientError):
    """The coordinator refused the request (4xx other than auth)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class CoordinatorClient:
    """Talks to one coordinator at ``url``."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        headers = bearer_header_bytes(token)
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers,
                                  timeout=httpx.Timeout(timeout_s, read=LONG_POLL_S + timeout_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call; an error answer or no answer raised as a ``ClientError``."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the coordinator at {self.url}: {exc}") from exc
        if response.status_code in (401, 403) and path != "/workers":
            raise AuthError(_detail(response))
        if 400 <= response.status_code < 600:
            raise RefusedError(response.status_code, _detail(response))
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError as exc:
            raise ClientError(f"not JSON from {self.url}{path}: {response.text[:200]!r}"
                              ) from exc
        if not isinstance(data, dict):
            raise ClientError(f"unexpected answer from {self.url}{path}")
        return data

    def status(self, *, wait: float = 0.0, since: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if since is not None and wait > 0:
            params = {"wait": wait, "since": since}
        return self._call("GET", "/status", params=params)

    def timeline_svg(self, drain: str = "current") -> str:
        """The drain's timeline drawn as SVG (``GET /status/timeline?format=svg``):
        ``current`` (the running or just finished drain) or ``last`` (``last_drain``)."""
        return self._request("GET", "/status/timeline",
                             params={"format": "svg", "drain": drain}).text

    def plan(self) -> dict[str, Any]:
        """The kill as it would run now (``GET /plan``)."""
        return self._call("GET", "/plan")

    def start_drain(self, reason: str, deadline_s: float | None, *,
                    force: bool = False) -> dict[str, Any]:
        """Start (or join) a drain without waiting for it; ``force`` SIGKILLs at once."""
        body: dict[str, Any] = {"wait": False, "reason": reason}
        if force:
            body["force"] = True
        if deadline_s is not None:
            body["deadline_s"] = deadline_s
        return self._call("POST", "/drain", json=body)

    def abort_drain(self) -> dict[str, Any]:
        """``DELETE /drain``: abort the running drain, or end the cycle of one that found
        nothing to drain; ``RefusedError`` (409) once processes were terminated."""
        return self._call("DELETE", "/drain")


def _detail(response: httpx.Response) -> str:
    """An error answer's ``detail``, as a terminal may print it (``render.shown``: it may
    quote a process's name or command line)."""
    try:
        data = response.json()
    except ValueError:
        return shown(response.text[:200])
    if isinstance(data, dict) and "detail" in data:
        return shown(str(data["detail"]))
    return shown(str(data)[:200])
