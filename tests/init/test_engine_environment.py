"""``run --engine NAME`` gives the engine its profile's environment (``engine_env``) where the
operator left it unset, read from the engine's own ``/proc/<pid>/environ``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.engines import PROFILES
from tests.init.wrapper import start_wrapper
from tests.support.processes import ProcessJanitor, wait_for

WAIT_FOR_TERM = "echo $$ > {pid}; trap 'exit 0' TERM; while :; do sleep 0.1; done"
"""An engine that writes its PID and exits 0 at SIGTERM."""


def _environ_of(janitor: ProcessJanitor, tmp_path: Path, *flags: str,
                env: dict[str, str] | None = None) -> dict[str, str]:
    pid_file = tmp_path / "engine.pid"
    wrapper = start_wrapper(janitor, tmp_path, ["sh", "-c", WAIT_FOR_TERM.format(
        pid=pid_file)], *flags, env=env)
    text = wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                    what="the engine's PID")
    raw = Path(f"/proc/{int(text)}/environ").read_bytes()
    os.kill(wrapper.pid, 15)
    assert wrapper.wait() == 0, wrapper.log.read_text()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.parametrize("operator", [None, "7"], ids=["unset", "set-by-the-operator"])
def test_the_vllm_profile_gives_its_workers_time_to_exit(janitor: ProcessJanitor,
                                                         tmp_path: Path,
                                                         operator: str | None) -> None:
    """1. ``run --engine vllm`` starts an engine; read its environment from ``/proc``.
    2. VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS is the profile's (vLLM's own 5 s made EngineCore
       SIGTERM its finalizing Worker, docs/deploy.md), or the operator's when set."""
    name = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
    env = {name: operator} if operator is not None else None
    if operator is None and name in os.environ:
        pytest.skip(f"{name} is set in this environment")
    seen = _environ_of(janitor, tmp_path, "--engine", "vllm", env=env)
    assert seen[name] == (operator or dict(PROFILES["vllm"].engine_env)[name])
    assert int(seen[name]) > 5


def test_without_a_profile_the_environment_is_the_wrappers(janitor: ProcessJanitor,
                                                           tmp_path: Path) -> None:
    """The generic profile adds nothing of an engine's own."""
    seen = _environ_of(janitor, tmp_path)
    assert not [name for name in seen if name.startswith("VLLM_")
                and name not in os.environ], seen
