"""The README's "In an engine" is ``deploy/examples/asyncio/streaming_engine.py``, shown
whole, and runs as printed against a coordinator started the way the manifests start it.

The README's block and the file are the same text; the file runs unmodified with the
environment the rendered engine container gets (``SHUTDOWN_COORDINATOR_URL`` and
``SHUTDOWN_COORDINATOR_TOKEN_FILE``, nothing else), next to a coordinator running the
rendered ConfigMap with its token file (auth on); the kubelet's deletion is the rendered
preStop hook, then SIGTERM. What happened is read from the stream's own bytes, the engine's
wait status and its log, not only from the coordinator's summary."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.rendering import Rendered, kubectl
from tests.deploy.simulated_pod import rendered
from tests.service.servers import ROOT, Running
from tests.support.processes import ProcessJanitor, wait_for

EXAMPLE = ROOT / "deploy" / "examples" / "asyncio" / "streaming_engine.py"
README = ROOT / "README.md"
TOKEN = "example-token"

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl renders the manifests")


def test_the_readme_shows_the_example_file_whole() -> None:
    """The README's "In an engine" code block is the example file, byte for byte."""
    text = README.read_text()
    section = text[text.index("\nIn an engine"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1) == EXAMPLE.read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _coordinator(janitor: ProcessJanitor, pod: Rendered, tmp: Path) -> Running:
    """The rendered ConfigMap, addresses and paths moved here; the Secret's token as a file;
    an engine that registers needs no engine profile (its patterns adopt nothing here)."""
    (tmp / "token").write_text(TOKEN + "\n")
    settings = dict(pod.settings)
    settings.update({
        "SHUTDOWN_COORDINATOR_HOST": "127.0.0.1",
        "SHUTDOWN_COORDINATOR_PORT": "0",
        "SHUTDOWN_COORDINATOR_PORT_FILE": str(tmp / "port.json"),
        "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp / "token"),
        "SHUTDOWN_COORDINATOR_STATE_FILE": str(tmp / "state.json"),
        "SHUTDOWN_COORDINATOR_DOORBELL": str(tmp / "doorbell"),
        "SHUTDOWN_COORDINATOR_ENGINE": "generic",
    })
    settings.pop("SHUTDOWN_COORDINATOR_ENGINE_METRICS_URL", None)
    with (tmp / "coordinator.log").open("ab") as log:
        proc = janitor.spawn([sys.executable, "-m", "coordinator", "serve"], cwd=ROOT,
                             env=settings, stdout=log, stderr=subprocess.STDOUT, service=True)
    url = wait_for(lambda: (tmp / "port.json").exists()
                   and json.loads((tmp / "port.json").read_text())["url"],
                   what="the coordinator listening")
    return Running(proc=proc, url=url, token=TOKEN, log=tmp / "coordinator.log")


def _events(lines: list[str]) -> list[Any]:
    return [line.removeprefix("data: ") if line == "data: [DONE]" else
            json.loads(line.removeprefix("data: ")) for line in lines if line]


def test_the_example_registers_with_auth_on_hands_a_stream_back_and_exits_0(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Render the vLLM overlay; start its coordinator (token file: auth on) and the
       example as printed, with only the engine container's two variables for the
       coordinator (its URL and token file) and its port as argument.
    2. It registers: ``/status`` lists it, with the token; nothing was refused (no 401).
    3. A stream runs; the kubelet deletes the pod: the rendered preStop hook. The stream
       ends with the handed-back event as its last server-sent event, no ``[DONE]``, its
       token count the events streamed before it; a router acknowledges it.
    4. The hook returns; the kubelet's SIGTERM: the engine exits 0 (its wait status), and
       the drain's summary says the same: graceful, nothing lost."""
    pod = rendered("vllm", tmp_path / "render")
    running = _coordinator(janitor, pod, tmp_path)
    container_env = pod.env(pod.engine)
    assert container_env["SHUTDOWN_COORDINATOR_URL"]["value"].startswith("http://127.0.0.1:")
    token_path = container_env["SHUTDOWN_COORDINATOR_TOKEN_FILE"]["value"]
    assert token_path.startswith("/var/run/shutdown-coordinator/token/")
    port = _free_port()
    env = {"SHUTDOWN_COORDINATOR_URL": running.url,
           "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp_path / "token"),
           "SHUTDOWN_COORDINATOR_TOKEN": ""}
    with (tmp_path / "engine.log").open("ab") as log:
        engine = janitor.spawn([sys.executable, str(EXAMPLE), str(port)], cwd=tmp_path,
                               env=env, stdout=log, stderr=subprocess.STDOUT)

    def registered() -> dict[str, Any] | None:
        workers = running.status()["workers"]
        return workers[0] if workers else None

    worker = wait_for(registered, what="the example registered")
    assert worker["pid"] == engine.pid
    assert worker["url"] == f"http://127.0.0.1:{port}"

    lines: list[str] = []
    streamed = threading.Event()

    def client() -> None:
        body = {"prompt": "p", "max_tokens": 10_000}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body,
                          headers={"X-Request-Id": "client-7.0"}, timeout=120) as response:
            for line in response.iter_lines():
                lines.append(line)
                if len([x for x in lines if x]) >= 3:
                    streamed.set()

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    assert streamed.wait(timeout=60), "the stream never flowed"

    hook_command = pod.engine["lifecycle"]["preStop"]["exec"]["command"]
    volume = pod.volume_at(pod.engine, hook_command[1])
    assert volume is not None
    hook = tmp_path / Path(hook_command[1]).name
    hook.write_text(pod.named("ConfigMap", volume["configMap"]["name"])["data"][hook.name])
    kubelet = janitor.spawn([sys.executable, str(hook), *hook_command[2:]],
                            env={"SHUTDOWN_COORDINATOR_URL": running.url,
                                 "SHUTDOWN_COORDINATOR_TOKEN_FILE": str(tmp_path / "token")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reader.join(timeout=120)
    assert not reader.is_alive()
    events = _events(lines)
    assert "[DONE]" not in events
    last = events[-1]
    assert last["handed_back"] is True
    assert last["request_id"] == "client-7.0"
    assert last["tokens"] == len(events) - 1  # every event before it was one token
    with running.client() as http:  # the router's acknowledgement
        acked = http.post("/migrations/ack", json={"request_ids": ["client-7.0"]}).json()
    assert "client-7.0" in acked["acked"] + acked["early"]
    out, _ = kubelet.communicate(timeout=120)
    assert kubelet.returncode == 0, out
    engine.send_signal(signal.SIGTERM)  # the kubelet's, once the hook returned
    assert engine.wait(timeout=60) == 0, (tmp_path / "engine.log").read_text()

    def done() -> dict[str, Any] | None:
        status = running.status()
        return status if status["phase"] == "done" else None

    status = wait_for(done, what="the drain done")
    drain = status["drain"]
    assert drain["outcome"] == "graceful", drain["causes"]
    assert drain["lost_requests"] == 0
    (process,) = [p for p in status["processes"] if p["pid"] == engine.pid]
    assert (process["fate"], process["exit_code"]) == ("exited", 0)
    # A refused token shows in the engine's log as worker_client giving up on the
    # coordinator, or a refused report (not as "401": a port number may hold those digits).
    engine_log = (tmp_path / "engine.log").read_text()
    assert "without a coordinator" not in engine_log, engine_log
    assert "refused" not in engine_log, engine_log
    assert "Traceback" not in engine_log + running.log.read_text()
