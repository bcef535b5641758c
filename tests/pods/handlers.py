"""Lifecycle handlers and probes, run the way the kubelet runs them against a podman pod.

- ``exec``: the command in the container (``podman exec``, as the CRI's ``ExecSync``); a
  non-zero exit is an error (``pkg/kubelet/lifecycle/handlers.go`` ``Run``; for a hook no
  timeout is given, the grace period bounds the wait for it, ``executePreStopHook``);
- ``httpGet``: from the node to the pod IP (``host`` when set) on the port, by number or by
  the container's port name, with the hook's headers and scheme; for a hook only a failed
  request is an error, the status is not looked at (``runHTTPHandler``); for a probe,
  200-399 is success and anything else, or no answer within ``timeoutSeconds``, a failure
  (``pkg/probe/http``);
- ``sleep``: the kubelet itself waits (``runSleepHandler``);
- ``tcpSocket`` (probes): a connection that opens.

The node reaches the pod through ``relay`` (a Unix socket per port that connects to the pod
IP inside the pod's network namespace).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.pods.spec import POD_IP

EXEC_OUTPUT_LIMIT = 16 * 1024


@dataclass
class HandlerResult:
    """What one hook or probe run did."""

    kind: str
    started_at: float
    ended_at: float | None = None
    error: str | None = None
    exit_code: int | None = None
    status: int | None = None
    output: str = ""

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.ended_at is None:
            return f"{self.kind}: still running"
        outcome = self.error or "ok"
        return f"{self.kind}: {outcome} ({self.ended_at - self.started_at:.1f} s)"


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A handler's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"no port named {port!r} in container {container.get('name')!r}")


def handler_ports(handler: Mapping[str, Any] | None, container: Mapping[str, Any]) -> set[int]:
    """The pod ports a hook or probe reaches (for the relay)."""
    if not handler:
        return set()
    for kind in ("httpGet", "tcpSocket"):
        if kind in handler:
            return {resolve_port(handler[kind]["port"], container)}
    return set()


class Node:
    """The node's side of one pod: its relay directory and how to run a command in it."""

    def __init__(self, relay_dir: Path, exec_argv: Callable[[str, Sequence[str]], list[str]],
                 spawn: Callable[..., subprocess.Popen[Any]], ip: str = POD_IP) -> None:
        self.relay_dir = relay_dir
        self.ip = ip
        """The pod's IP, where the relay connects and the kubelet's requests are sent."""
        self._exec_argv = exec_argv
        self._spawn = spawn
        self._running: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()

    def transport(self, port: int) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(uds=str(self.relay_dir / f"{port}.sock"))

    def client(self, port: int, timeout: float | None = 60.0, **kwargs: Any) -> httpx.Client:
        """An HTTP client whose requests reach the pod's ``ip:port`` inside the pod."""
        return httpx.Client(transport=self.transport(port), base_url=f"http://{self.ip}:{port}",
                            timeout=timeout, **kwargs)

    def run(self, handler: Mapping[str, Any], container: Mapping[str, Any], container_id: str,
            *, probe_timeout: float | None = None) -> HandlerResult:
        """Run one handler to its end (``probe_timeout``: as a probe, bounded and judged by
        its status)."""
        if "exec" in handler:
            return self._exec(handler["exec"]["command"], container_id, probe_timeout)
        if "httpGet" in handler:
            return self._http(handler["httpGet"], container, probe_timeout)
        if "sleep" in handler:
            result = HandlerResult("sleep", time.time())
            time.sleep(float(handler["sleep"]["seconds"]))
            result.ended_at = time.time()
            return result
        if "tcpSocket" in handler:
            return self._tcp(handler["tcpSocket"], container, probe_timeout or 1.0)
        raise ValueError(f"unsupported handler {handler!r}")

    def _exec(self, command: Sequence[str], container_id: str,
              timeout: float | None) -> HandlerResult:
        result = HandlerResult("exec", time.time())
        proc = self._spawn(self._exec_argv(container_id, command), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        with self._lock:
            self._running.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            result.error = f"command timed out after {timeout} s"
        finally:
            with self._lock:
                self._running.remove(proc)
        result.ended_at = time.time()
        result.output = out.decode(errors="replace")[-EXEC_OUTPUT_LIMIT:]
        result.exit_code = proc.returncode
        if result.error is None and proc.returncode != 0:
            result.error = f"command {list(command)} exited with {proc.returncode}"
        return result

    def _http(self, spec: Mapping[str, Any], container: Mapping[str, Any],
              probe_timeout: float | None) -> HandlerResult:
        result = HandlerResult("httpGet", time.time())
        port = resolve_port(spec["port"], container)
        host = spec.get("host") or self.ip
        path = spec.get("path") or "/"
        headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
        url = f"{str(spec.get('scheme', 'HTTP')).lower()}://{host}:{port}{path}"
        try:
            with httpx.Client(transport=self.transport(port), timeout=probe_timeout) as client:
                response = client.get(url, headers=headers)
            result.status = response.status_code
            result.output = response.text[:EXEC_OUTPUT_LIMIT]
            if probe_timeout is not None and not 200 <= response.status_code < 400:
                result.error = f"HTTP probe failed with statuscode: {response.status_code}"
        except httpx.HTTPError as exc:
            result.error = f"Get {url!r}: {type(exc).__name__}: {exc}"
        result.ended_at = time.time()
        return result

    def _tcp(self, spec: Mapping[str, Any], container: Mapping[str, Any],
             timeout: float) -> HandlerResult:
        result = HandlerResult("tcpSocket", time.time())
        port = resolve_port(spec["port"], container)
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(timeout)
                sock.connect(str(self.relay_dir / f"{port}.sock"))
                # The relay closes at once what the pod refuses.
                sock.settimeout(0.2)
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        result.error = f"dial tcp {self.ip}:{port}: connection refused"
                except TimeoutError:
                    pass
        except OSError as exc:
            result.error = f"dial tcp {self.ip}:{port}: {exc}"
        result.ended_at = time.time()
        return result

    def kill_running(self) -> None:
        """End every ``podman exec`` client still running (a hook outliving its pod)."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
