"""The real vLLM and SGLang as a container's main process under ``run`` as its PID 1, stopped by
``podman stop`` (``tests.init.real_containers``): every process's signals, their senders and
its end from the kernel (strace attached from the host), podman's exit code, the zombies, the
stream. Container step; minutes each on 2 cores, so only with ``INIT_COMPARE_ALL=1``
(``python -m tests.init.real_containers`` prints the whole table)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engines.tiny_model import write_tiny_model
from tests.init.containers import unavailable
from tests.init.real_containers import run_one
from tests.init.real_engines import unavailable as engine_unavailable
from tests.pods.images import Images
from tests.pods.podman import Podman

pytestmark = [
    pytest.mark.container, pytest.mark.timeout(3600),
    pytest.mark.skipif(os.environ.get("INIT_COMPARE_ALL") != "1",
                       reason="a real engine's start takes minutes on 2 cores: "
                       "INIT_COMPARE_ALL=1 runs it")]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_run_as_pid_1_stops_the_real_engine_as_well_as_its_own_sigterm(
        podman: Podman, images: Images, tmp_path: Path, engine: str) -> None:
    """1. The real engine under ``run --engine ENGINE`` as the container's PID 1, a stream
       in flight, ``podman stop -t 120``.
    2. podman records 0; the stream is whole; no zombie before the stop, and none of
       ``run``'s children stays one during it.
    3. ``run`` SIGTERMed the engine's main process, and never a process group; it sent no
       SIGKILL.
    4. No process ends worse than under the engine's own SIGTERM handling: vLLM, every
       process exits 0 (EngineCore never has to SIGTERM a Worker); SGLang, every process
       exits 0 but the two its own ``kill_process_tree`` SIGKILLs (detokenizer, resource
       tracker). No SIGTERM comes from anyone but the runtime, ``run`` and the main process.
    5. ``run``'s summary says the exit code podman recorded."""
    reason = engine_unavailable(engine) or unavailable()
    if reason is not None:
        pytest.skip(reason)
    model = write_tiny_model(tmp_path / "model")
    row = run_one(podman, images, "run", engine, model, tmp_path / "run")
    print(row.markdown())
    assert row.exit_code == 0, row.log[-3000:]
    assert row.stream == "whole", row.fates()
    assert (row.zombies_before, row.zombies_of_pid1) == (0, 0), row.fates()
    init = row.processes[row.init_pid][1]
    assert init.sent, row.fates()
    assert not [t for _, t, _ in init.sent if t.startswith("-")], init.sent
    assert "SIGKILL" not in {sig for _, _, sig in init.sent}, init.sent
    ns_init = row.processes[row.init_pid][0].pid
    main_seen, main = row.processes[row.main_pid]
    assert ("SIGTERM", ns_init) in main.received, row.fates()
    assert main.end == "exited 0", row.fates()
    killed = sorted(seen.name for pid, (seen, traced) in row.processes.items()
                    if pid not in (row.init_pid, row.main_pid) and traced.end != "exited 0")
    assert killed == ([] if engine == "vllm" else ["python", "sglang::detokenizer"]), \
        row.fates()
    for seen, traced in row.processes.values():
        for sig, sender in traced.received:
            if sig in ("SIGTERM", "SIGKILL") and sender not in (0, ns_init, main_seen.pid):
                raise AssertionError(f"{seen.name} got {sig} from {row.sender(sender)}: "
                                     f"{row.fates()}")
    assert row.summary is not None, row.log[-3000:]
    assert row.summary["exit_code"] == "0", row.summary
