"""Engine profiles (``--engine``): the patterns find each engine's root from its real command
line and nothing else, the plan stops the root first, an explicit flag wins over the profile,
and on a real SGLang-shaped tree (a watchdog that SIGKILLs everything when a child dies) the
profile ends every process cleanly where the default order makes the engine kill itself."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import pytest

from coordinator.engines import PROFILES
from coordinator.kill import patterns
from coordinator.kill.tiers import Member, plan_tiers
from coordinator.settings import Settings
from devstack.sim.launcher import start_engine
from tests.kill.helpers import alive
from tests.service.servers import FAST, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for

ROOTS = {
    "vllm": ["/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m --port 8000",
             "python3 -u -m vllm.entrypoints.openai.api_server --model m",
             "/usr/bin/python3 /usr/local/bin/vllm serve m --port 8000",
             "vllm serve m"],
    "sglang": ["python3 -m sglang.launch_server --model-path m --port 30000",
               "/usr/bin/python3.11 /usr/local/bin/sglang serve --model-path m"],
    "dynamo": ["python3 -m dynamo.vllm --model m", "python -m dynamo.sglang --model-path m",
               "/opt/venv/bin/python -m dynamo.mocker --model-path m --model-name m"],
    "trtllm": ["/usr/bin/python3 /usr/local/bin/trtllm-serve m --port 8000",
               "trtllm-serve m"],
    "tgi": ["text-generation-launcher --model-id m",
            "/usr/local/bin/text-generation-launcher --model-id m"],
}
NOT_ROOTS = [
    # The coordinator itself, told about the engine; a shell wrapper; the engines' children
    # (process titles, set by setproctitle); other tools.
    "python3 -m coordinator serve --engine vllm --adopt-pattern vllm serve",
    "bash -c vllm serve m",
    "sh -c python3 -m sglang.launch_server --model-path m",
    "VLLM::EngineCore", "VLLM::Worker_TP0", "sglang::scheduler_TP0", "sglang::detokenizer",
    "python3 -m dynamo.frontend --http-port 8000", "python3 -m dynamo.mockery",
    "/usr/bin/python3 /usr/local/bin/text-generation-server serve m --uds-path /tmp/x",
    "text-generation-router --port 3000",
    "python3 -m mpi4py.futures.server",
    "grep vllm serve",
]


@pytest.mark.parametrize("engine", sorted(ROOTS))
def test_each_profile_finds_its_root_and_nothing_else(engine: str) -> None:
    found = PROFILES[engine].adopt_patterns
    for cmdline in ROOTS[engine]:
        assert any(patterns.search(p, cmdline) for p in found), cmdline
    for cmdline in NOT_ROOTS + [c for other, cs in ROOTS.items() if other != engine
                                for c in cs if not (engine == "dynamo" and "dynamo" in c)]:
        assert not any(patterns.search(p, cmdline) for p in found), cmdline


VLLM_TREE = [Member(10, 1, 0, "python3", "vllm serve m", "adopted", 10),
             Member(11, 10, 1, "VLLM::EngineCor", "VLLM::EngineCore", None, 10),
             Member(12, 11, 2, "VLLM::Worker_TP", "VLLM::Worker_TP0", None, 10),
             Member(13, 10, 1, "python3", "python3 -c from multiprocessing.resource_tracker "
                    "import main;main(5)", None, 10)]


def planned(engine: str, tree: list[Member] = VLLM_TREE) -> list[tuple[str, tuple[int, ...]]]:
    plan = plan_tiers(tree, {10: tuple(Settings(engine=engine).adopt_tiers)},
                      default_signal=signal.SIGTERM, default_timeout_s=10.0)
    return [(t.name, t.pids) for t in plan]


@pytest.mark.parametrize("engine", ["sglang", "dynamo", "trtllm", "tgi"])
def test_engines_that_stop_their_own_children_get_the_first_sigterm(engine: str) -> None:
    """The root alone first, then whatever outlives it, deepest first."""
    assert planned(engine) == [(f"{engine}-root", (10,)), ("depth-2", (12,)),
                               ("depth-1", (11, 13))]


def test_vllm_engine_core_first_then_its_workers_the_api_server_last() -> None:
    assert planned("vllm") == [("engine-core", (11,)), ("workers", (12,)), ("depth-1", (13,)),
                               ("roots", (10,))]
    assert [t[1] for t in planned("generic")] == [(12,), (11, 13), (10,)]


@pytest.mark.parametrize("flag", ["--shutdown-timeout=30", "--shutdown-timeout 5"])
def test_vllm_with_its_own_graceful_wait_gets_the_api_server_first(flag: str) -> None:
    """The API server stops its engine itself when its --shutdown-timeout is on; a timeout
    of 0 (vLLM's default) is the same as none."""
    root = VLLM_TREE[0]
    with_wait = [dataclasses.replace(root, cmdline=f"vllm serve m {flag} --port 8000"),
                 *VLLM_TREE[1:]]
    # what outlives the API server is then stopped in the order without it
    assert planned("vllm", with_wait) == [("api-server", (10,)), ("engine-core", (11,)),
                                          ("workers", (12,)), ("depth-1", (13,))]
    zero = [dataclasses.replace(root, cmdline="vllm serve m --shutdown-timeout=0"), *VLLM_TREE[1:]]
    assert planned("vllm", zero)[0] == ("engine-core", (11,))


def test_a_flag_given_wins_over_the_profile() -> None:
    settings = Settings(engine="vllm", adopt_patterns=["mine"], engine_metrics_url=None,
                        engine_inflight_metrics=["my:gauge"])
    assert settings.adopt_patterns == ["mine"]
    assert settings.engine_metrics_url is None
    assert settings.engine_inflight_metrics == ["my:gauge"]
    assert [t.name for t in settings.adopt_tiers] == ["api-server", "engine-core", "workers"]
    assert Settings(engine="sglang").engine_metrics_url == "http://127.0.0.1:30000/metrics"
    assert Settings().adopt_patterns == []


def drain_sglang_shaped(janitor: ProcessJanitor, tmp_path: Path, *engine_flag: str,
                        ) -> tuple[Any, dict[str, Any], int]:
    """An unmodified SGLang-shaped engine (2 schedulers with PDEATHSIG, a detokenizer, a
    watchdog that SIGKILLs the tree when a child dies, a main process that stops its children
    itself on SIGTERM), adopted by its command line; drained. The engine, the summary and
    the main process's wait status."""
    engine = start_engine(janitor.spawn, tmp_path / "records", schedulers=2, watchdog=True,
                          graceful_main=True, teardown_s=0.2)
    running = start_coordinator(
        janitor, tmp_path, *FAST, "--tier-timeout", "5", *engine_flag,
        "--adopt-pattern", rf"-m devstack\.sim --record-dir {tmp_path / 'records'}( |$)")
    wait_for(lambda: len(running.status()["processes"]) == len(engine.processes),
             what="the engine's tree listed")
    with running.client(timeout=120) as client:
        summary: dict[str, Any] = client.get("/drain").json()
    return engine, summary, engine.proc.wait(timeout=60)


def test_the_profile_ends_an_sglang_shaped_tree_cleanly(janitor: ProcessJanitor,
                                                        tmp_path: Path) -> None:
    """``--engine sglang``: the main process gets the first SIGTERM (its own record), stops
    its children itself, every process finishes its cleanup and exits 0 (their records and
    the main process's wait status), nothing runs, and the summary says so."""
    engine, summary, main_code = drain_sglang_shaped(janitor, tmp_path, "--engine", "sglang")
    records = {r["pid"]: r for r in engine.records()}
    assert sorted(records) == sorted(p.pid for p in engine.processes)
    assert main_code == 0
    assert {r["cleanup"] for r in records.values()} == {"finished"}
    assert {r["exit_code"] for r in records.values()} == {0}
    main = records[engine.pid]
    assert main["signal"] == "SIGTERM"
    assert all(main["signalled_at"] <= r["signalled_at"] for r in records.values())
    assert not [pid for pid in records if alive(pid)]
    assert summary["outcome"] == "graceful"
    by_pid = {p["pid"]: p for p in summary["processes"]}
    assert sorted(by_pid) == sorted(records)
    assert by_pid[engine.pid]["tier"] == "sglang-root"
    assert (by_pid[engine.pid]["fate"], by_pid[engine.pid]["exit_code"]) == ("exited", 0)


def test_without_the_profile_the_watchdog_kills_the_tree(janitor: ProcessJanitor,
                                                         tmp_path: Path) -> None:
    """The same engine with the default order (children first): the first scheduler's
    SIGTERM trips the engine's watchdog, which SIGKILLs the tree and the main process (its
    wait status -9): the summary must not call that graceful."""
    engine, summary, main_code = drain_sglang_shaped(janitor, tmp_path)
    assert main_code == -signal.SIGKILL
    assert summary["outcome"] != "graceful"
    assert not [p.pid for p in engine.processes if alive(p.pid)]
