"""Stock SGLang and stock vLLM servers as the ``--end-streams`` tests and bench start them:
each with its own log of requests (SGLang ``--log-requests``, vLLM
``--enable-log-requests``), vLLM with its abort call mounted (``VLLM_SERVER_DEV_MODE=1``) and
the environment the manifests give it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from coordinator.engines import PROFILES
from devstack.routers import free_port
from tests.engines.sglang_stack import start_sglang
from tests.engines.stack import peer_core_env, start_vllm
from tests.support.processes import ProcessJanitor


@dataclass
class Server:
    """One stock engine: its main process, URL, the name requests give as ``model``, its
    log, and how a coordinator finds it alone."""

    pid: int
    url: str
    model: str
    log: Path
    pattern: str

    def metric(self, name: str) -> float:
        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rpartition(" ")[2])
        return total


def sglang(janitor: ProcessJanitor, tmp: Path, model: Path, name: str) -> Server:
    port = free_port()
    (tmp / name).mkdir(parents=True, exist_ok=True)
    server = start_sglang(janitor, tmp / name, model, port=port,
                          flags=["--log-requests", "--log-requests-level", "0"])
    return Server(server.proc.pid, server.url, server.model, server.log,
                  rf"sglang\.launch_server .*--port {port}(\s|$)")


VLLM_ENV = PROFILES["vllm"].engine_env
"""What the shipped manifests give a vLLM (its Worker's own exit waited for 20 s, not 5: on
a loaded machine EngineCore otherwise SIGTERMs it, then hangs until its tier's SIGKILL)."""


def vllm(janitor: ProcessJanitor, tmp: Path, model: Path, name: str) -> Server:
    (tmp / name).mkdir(parents=True, exist_ok=True)
    server = start_vllm(janitor, tmp / name, model, max_model_len=16384,
                        flags=["--enable-log-requests"],
                        extra_env={"VLLM_SERVER_DEV_MODE": "1", **dict(VLLM_ENV),
                                   **(peer_core_env() if name == "peer" else {})})
    port = server.url.rpartition(":")[2]
    return Server(server.proc.pid, server.url, server.served_model, server.log,
                  rf"vllm\.entrypoints\.openai\.api_server .*--port {port}(\s|$)")


VLLM_SUFFIX = re.compile(r"-0-[0-9a-f]+$")
"""What vLLM's engine adds to the API server's request id (``cmpl-ID-0-abcd1234``)."""

STARTERS: dict[str, Callable[[ProcessJanitor, Path, Path, str], Server]] = {
    "sglang": sglang, "vllm": vllm}


def finished(engine: str, server: Server) -> list[str]:
    """How each request the engine logged ended, by its own log: SGLang's ``Finish:`` lines
    (``--log-requests``) by their finish reason's type, its health checks' left out; vLLM's
    ``Added request`` lines by request id, each marked ``abort`` when an ``Aborted
    request(s)`` line names it (``--enable-log-requests``; the line is logged with no id
    when nothing was aborted)."""
    text = server.log.read_text(errors="replace")
    if engine == "sglang":
        # Its /health runs a generation of its own (rid HEALTH_CHECK_..., the router's
        # health checks and ours): not a request anyone sent.
        return [m.group(2) for m in re.finditer(
            r"Finish: obj=GenerateReqInput\(rid='([^']*)'.*?'finish_reason': \{'type': '(\w+)'",
            text) if not m.group(1).startswith("HEALTH_CHECK")]
    # Both lines name a request by its engine id: the API server's id, "-0-" (the choice)
    # and a random suffix of its own.
    aborted = {VLLM_SUFFIX.sub("", i.strip())
               for m in re.finditer(r"Aborted request\(s\) (.*)\.$", text, re.M)
               for i in m.group(1).split(",") if i.strip()}
    added = re.findall(r"Added request (cmpl-\S+?)(?:-0-[0-9a-f]+)?\.$", text, re.M)
    return [f"{i} abort" if i in aborted else i for i in added]
