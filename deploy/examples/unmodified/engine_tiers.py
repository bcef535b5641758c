"""Kill tiers for each engine's process tree, keyed by the process titles the engines set.

The coordinator's default order (deepest processes first, the root last) suits trees whose
children are independent. vLLM and SGLang are not: their parents watch their children and
turn one child's exit into a crash of the whole tree. Each tier below names the process that
owns the orderly teardown of the processes under it, so that one gets SIGTERM first and runs
its own shutdown, and everything else is what is left (normally already gone). Patterns are
searched in ``name + " " + cmdline``: after ``setproctitle`` the command line is the title,
while the name is cut to 15 characters, so patterns are not anchored.

Process titles, read from the engines' sources:

- vLLM (``vllm.utils.system_utils.set_process_title``, prefix ``VLLM_PROCESS_NAME_PREFIX``,
  default ``VLLM``): ``VLLM::EngineCore`` (``VLLM::EngineCore_DP<n>`` with data parallelism),
  its executor's ``VLLM::Worker`` (``VLLM::Worker_TP<n>...`` with tensor/pipeline
  parallelism), ``VLLM::DPCoordinator``, ``VLLM::APIServer_<n>`` with ``--api-server-count``
  > 1; the API server itself keeps its command line (``python -m
  vllm.entrypoints.openai.api_server`` or ``vllm serve``). Also a multiprocessing
  ``resource_tracker`` child.
- SGLang (``setproctitle`` calls in ``sglang/srt/managers``): ``sglang::scheduler`` (with a
  ``_TP<n>``/``_DP<n>``/``_PP<n>`` suffix), ``sglang::detokenizer``,
  ``sglang::data_parallel_controller``, ``sglang::tokenizer_worker:<pid>``,
  ``sglang::detokenizer_router``; the main process (HTTP server and tokenizer manager) keeps
  its command line (``python -m sglang.launch_server``).
"""

from __future__ import annotations

from typing import Any

VLLM_TIERS: list[dict[str, Any]] = [
    # EngineCore's SIGTERM handler stops its busy loop and shuts its executor down, which
    # terminates the Worker processes and waits for them ("all workers exited gracefully").
    # SIGTERMing a Worker first instead makes EngineCore report "Worker proc died
    # unexpectedly" and the API server force-kill EngineCore (EngineDeadError).
    {"name": "engine-core", "pattern": r"VLLM::(EngineCore|DPCoordinator)", "timeout_s": 40},
    {"name": "workers", "pattern": r"VLLM::Worker", "timeout_s": 10},
]
"""The API server (the root) goes last and exits 0 once its engine core is gone."""

SGLANG_ROOT_FIRST_TIERS: list[dict[str, Any]] = [
    {"name": "main", "pattern": r"sglang\.launch_server", "timeout_s": 3600,
     "include_root": True},
]
"""SGLang, unmodified: SIGTERM its main process first and alone, bounded by the drain's
deadline only (the timeout is never reached). SGLang 0.5.23's own SIGTERM path waits for its
requests, sends its schedulers ShutdownReq (they exit 0) and SIGKILLs the detokenizer and the
resource tracker (kill_process_tree), so its watchdog never sees a child die. Children first
would not do: a scheduler has no SIGTERM handler, exits -15, and the main process's
SubprocessWatchdog SIGQUITs it into SIGKILLing the whole tree (docs/engines.md, measured on
the real engine)."""

ENGINE_TIERS: dict[str, list[dict[str, Any]]] = {
    "vllm": VLLM_TIERS, "sglang": SGLANG_ROOT_FIRST_TIERS}

ADOPT_TIERS: dict[str, list[dict[str, Any]]] = {
    "vllm": VLLM_TIERS, "sglang": SGLANG_ROOT_FIRST_TIERS}
"""The tiers to give ``serve --adopt-tier`` for an engine adopted by pattern."""


def adopt_tier_flags(engine: str) -> list[str]:
    """``--adopt-tier`` arguments for ``engine`` (``NAME=REGEX:TIMEOUT_S[:root]`` each)."""
    flags: list[str] = []
    for tier in ADOPT_TIERS[engine]:
        text = f"{tier['name']}={tier['pattern']}:{tier.get('timeout_s', 10)}"
        if tier.get("include_root"):
            text += ":root"
        flags += ["--adopt-tier", text]
    return flags


if __name__ == "__main__":
    import shlex
    import sys

    print(shlex.join(adopt_tier_flags(sys.argv[1] if len(sys.argv) > 1 else "vllm")))
