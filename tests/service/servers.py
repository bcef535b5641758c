"""Start a real coordinator (``python -m coordinator serve``) on a free loopback port."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ProcessJanitor, wait_for

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--grace-period", "12", "--safety-margin", "1", "--tier-timeout", "2",
        "--confirm-timeout", "1", "--prekill-timeout", "1", "--scan-interval", "0.5"]
"""Small budgets so a drain of a tree that ignores SIGTERM ends in a few seconds."""


@dataclass
class Running:
    """A coordinator process the test owns."""

    proc: subprocess.Popen[Any]
    url: str
    token: str | None
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, timeout: float = 60.0, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout, **kwargs)

    def status(self) -> dict[str, Any]:
        with self.client() as client:
            response = client.get("/status")
            response.raise_for_status()
            data: dict[str, Any] = response.json()
            return data


def start_coordinator(janitor: ProcessJanitor, tmp: Path, *args: str, token: str | None = None,
                      name: str = "coordinator", source: Path = ROOT) -> Running:
    """Start ``serve --port 0`` with ``args`` and wait until it answers ``/healthz``.

    A service of the janitor: one the test leaves running gets SIGTERM at the end and must
    exit 0 (after removing its doorbell pipe) within the janitor's bound. ``source``: the
    checkout whose ``coordinator`` package runs (a benchmark's "before")."""
    port_file = tmp / f"{name}.port.json"
    port_file.unlink(missing_ok=True)
    extra: list[str] = []
    if token is not None:
        token_file = tmp / f"{name}.token"
        token_file.write_text(token + "\n")
        extra = ["--token-file", str(token_file)]
    log = tmp / f"{name}.log"
    handle = log.open("ab")
    proc = janitor.spawn_python(
        ["-m", "coordinator", "serve", "--port", "0", "--port-file", str(port_file),
         "--log-level", "warning", *extra, *args],
        cwd=source, stdout=handle, stderr=subprocess.STDOUT, service=True)
    handle.close()

    def ready() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"coordinator exited {proc.returncode}: {log.read_text()}")
        if not port_file.exists():
            return None
        url = str(json.loads(port_file.read_text())["url"])
        try:
            return url if httpx.get(url + "/healthz", timeout=5).status_code == 200 else None
        except httpx.HTTPError:
            return None

    url = wait_for(ready, what="coordinator listening")
    return Running(proc=proc, url=url, token=token, log=log)


def hold_drains(running: Running, pid: int) -> str:
    """Register ``pid`` as a worker with 1 request in flight: every drain then waits in
    ``migrating`` (until it reports 0, the drain is aborted, or the migration deadline);
    returns its id."""
    worker_id = str(register(running, pid, role="holder")["id"])
    with running.client() as client:
        response = client.post(f"/workers/{worker_id}/report", json={"inflight": 1})
        assert response.status_code == 200, response.text
    return worker_id


def register(running: Running, pid: int, **fields: Any) -> dict[str, Any]:
    """Register ``pid`` as a worker; returns the answer."""
    with running.client() as client:
        response = client.post("/workers", json={"pid": pid, **fields})
        assert response.status_code in (200, 201), response.text
        data: dict[str, Any] = response.json()
        return data
