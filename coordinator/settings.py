"""The coordinator's settings: typed, documented fields, each also read from the environment.

Every field reads ``SHUTDOWN_COORDINATOR_<FIELD>`` (the name in any case); a value given to
``Settings(...)``, as ``serve``'s command-line flags are, wins over the environment. Lists
(``ADOPT_PIDS``, ``ADOPT_PATTERNS``, ``ROUTERS``) accept a JSON list or a comma-separated
string; ``ADOPT_TIERS`` a JSON list or one tier per line (regular expressions may hold
commas).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from coordinator.engines import PROFILES, EngineName
from coordinator.group.membership import membership
from coordinator.kill import patterns
from coordinator.kill.policy import TierSpec
from coordinator.router_settings import RouterSpec, http_url, parse_router
from coordinator.tier_settings import parse_tiers

ENV_PREFIX = "SHUTDOWN_COORDINATOR_"
DEFAULT_PORT = 8787
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
DEFAULT_INFLIGHT_METRICS = (
    # vllm/v1/metrics/loggers.py (PrometheusStatLogger)
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    # sglang/srt/metrics/collector.py (SchedulerMetricsCollector)
    "sglang:num_running_reqs", "sglang:num_queue_reqs",
)


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def from_environment(environ: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The values ``environ`` holds for the fields ``names``: ``ENV_PREFIX`` + the name, in
    any case, as text (each field's validation reads it, lists included)."""
    wanted = {ENV_PREFIX.lower() + name.lower(): name for name in names}
    return {wanted[key.lower()]: value for key, value in environ.items()
            if key.lower() in wanted}


class Settings(BaseModel):
    """Everything ``shutdown-coordinator serve`` can be told.

    A plain pydantic model that reads the environment itself (``from_environment``), with
    no settings library: one dependency fewer, and about 8 ms less of the coordinator's
    start (0.330 -> 0.320 s of CPU to its first ``/healthz``)."""

    model_config = ConfigDict(extra="ignore", validate_default=True)

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default: in a pod the kubelet's hooks and the engine's
    containers share the network namespace, so nothing else needs to reach it."""
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    """TCP port; 0 picks a free one (see ``port_file``)."""
    port_file: Path | None = None
    """When set, the bound address is written there as JSON ``{"host", "port", "url", "pid"}``
    once the server listens (useful with ``port=0``)."""

    grace_period_s: float = Field(30.0, gt=0, le=86_400)
    """Seconds: the pod's ``terminationGracePeriodSeconds``. Default 30, Kubernetes' default.
    The drain budget is derived from it."""
    safety_margin_s: float = Field(5.0, ge=0, le=86_400)
    """Seconds of the grace period the drain leaves unused. After ``preStop`` returns the
    kubelet still has to deliver SIGTERM to every container and see them exit before its own
    SIGKILL at the end of the grace period; 5 s covers the hook's HTTP round trip, container
    runtime latency and the coordinator's own exit with room to spare on a loaded node."""
    min_drain_s: float = Field(0.0, ge=0, le=86_400)
    """Seconds to stay in ``draining`` at least, for Service endpoint propagation when traffic
    does not come through a router watching ``/status``. Default 0. Cut to the migration share
    of the budget."""
    tier_timeout_s: float = Field(10.0, gt=0, le=3_600)
    """Seconds each kill tier waits between its graceful signal and SIGKILL (SGLang's default
    child shutdown timeout). The termination share of the budget always fits one full tier."""
    confirm_s: float = Field(2.0, gt=0, le=600)
    """Seconds to wait for a SIGKILLed process to disappear before calling it ``survived``."""
    prekill_timeout_s: float = Field(2.0, ge=0, le=600)
    """Seconds to wait for connected workers' ``prekill_done`` after the ``terminate`` event
    before the kill starts anyway."""
    termination_share: float = Field(0.4, gt=0, lt=1)
    """Fraction of the budget reserved for termination (at least one tier plus confirmation);
    the rest is for draining and migration."""

    token: SecretStr | None = None
    """Bearer token every call but ``/healthz``, ``/readyz`` and ``/metrics`` must carry.
    Prefer ``token_file`` (environment variables show up in ``/proc/<pid>/environ``)."""
    token_file: Path | None = None
    """File holding the bearer token (surrounding whitespace ignored); wins over ``token``.
    An empty or unreadable file refuses the start (see ``coordinator.service.posture``)."""
    public_host: str | None = None
    """A second address to listen on, with the same port, for the routes that never need a
    token (``/healthz``, ``/readyz``, ``/metrics``) and nothing else: the pod's IP (from the
    downward API), so the kubelet's probes and Prometheus reach a coordinator whose API stays
    on loopback, with no token and no Secret (``shutdown-coordinator run`` in the engine's
    container). A specific address, neither loopback nor a wildcard. Unset: none."""
    allow_unauthenticated_network: bool = False
    """Serve a non-loopback ``host`` without a token. Off by default: such a start is refused,
    because anyone who can reach the port could drain and kill the pod. Turn it on only on
    a network nobody else reaches."""

    allowed_hosts: list[str] = Field(default_factory=list)
    """Names a request's ``Host`` may carry besides the ones the coordinator always answers
    to (any IP address, ``localhost``, this host's name, the group's names): a Service's DNS
    name a client dials, say. Others are answered 421, so a DNS name rebound to this address
    by a web page cannot reach the API (``coordinator.service.browsers``). ``*``: any."""

    engine: EngineName = "generic"
    """The engine next to this coordinator (``coordinator.engines``): its profile fills in the
    adoption patterns, the kill tiers of adopted trees and the in-flight probe, wherever
    those are not given. ``generic``: none of that; children before parents."""
    adopt_pids: list[int] = Field(default_factory=list)
    """PIDs of process trees to drain although they never register (unmodified engines)."""
    adopt_patterns: list[str] = Field(default_factory=list)
    """Regular expressions searched in command lines; matching trees are adopted, and
    re-discovered when the kill starts (an engine may have restarted since)."""
    adopt_tiers: list[TierSpec] = Field(default_factory=list)
    """Kill tiers for adopted trees, ``NAME=REGEX[:TIMEOUT_S[:SIGNAL]][:root]`` each (see
    ``coordinator.tier_settings``): matching processes are signalled in this order before
    the default deepest-first order; ``root`` lets a tier hold the adopted root itself."""
    engine_metrics_url: str | None = Field(None, max_length=2048)
    """The Prometheus endpoint of an engine that does not register (``http://127.0.0.1:8000/
    metrics`` for a stock vLLM): while a drain migrates, its in-flight gauges are read and the
    migrating phase holds until they reach 0 (see ``coordinator.service.engine_probe``)."""
    engine_inflight_metrics: list[str] = Field(
        default_factory=lambda: list(DEFAULT_INFLIGHT_METRICS))
    """The gauges whose sum is the engine's in-flight requests. Default: vLLM's and SGLang's
    running and waiting requests (an engine exports only its own)."""
    end_streams: bool = False
    """A layer that continues a stream which ends early sits in front of this engine (the
    continuation proxy, watching this coordinator; or a router that does the same): once the
    routers took the pod out, the drain ends the engine's in-flight requests at once through
    its own API (the profile's, ``coordinator.engines``: SGLang ``POST /abort_request``,
    vLLM ``POST /abort_requests``) instead of waiting for them, and the proxy continues
    each one on another pod (``coordinator.drain.ending``). Only the streams the proxy
    acknowledges taking over count as handed to it; the rest are counted cut. Off by
    default: without such a layer in front, every stream ended would be cut. Needs an
    engine whose profile knows the call, and its in-flight gauges
    (``engine_metrics_url``)."""
    engine_url: str | None = Field(None, max_length=2048)
    """The engine's own API, for ``end_streams`` (``http://127.0.0.1:30000`` for SGLang).
    Unset: the profile's default port on loopback."""
    routers: list[RouterSpec] = Field(default_factory=list)
    """Routers in front of this pod's engine, ``KIND=URL`` each (``smg``, ``vllm-router``,
    ``reference``; see ``coordinator.router_settings``): at a drain's first millisecond each
    is told through its own API to send the engine nothing new, and on an abort to send it
    requests again (``coordinator.service.router_adapters``). A router that cannot be reached
    never holds the drain: each call is bounded and retried, and its failure is shown in
    ``/status`` ``routers`` and the metrics."""
    router_worker_url: str | None = Field(None, max_length=2048)
    """How the routers know this pod's engine (``http://POD_IP:PORT``, as the router was given
    it; in Kubernetes from the pod's IP through the downward API). Needed by ``smg`` and
    ``vllm-router`` routers."""
    router_join: bool = True
    """When the coordinator starts with routers (and no drain to resume), wait for the engine
    at ``router_worker_url`` to answer ``GET /health`` with 200, then add it to every router
    (smg: ``POST /workers``; vllm-router: ``POST /add_worker``): a pod that replaces a drained
    one comes back into routers that do not discover pods themselves. A router that already
    lists it (one with service discovery) is left as it is."""
    router_token_file: Path | None = None
    """File holding smg's control-plane key (``--control-plane-api-keys``), sent as
    ``Authorization: Bearer`` on its ``/workers`` calls. Unset: none sent (smg's control
    plane open). An empty or unreadable file refuses the start."""
    confine_to_pid: int | None = Field(None, ge=1)
    """Hardening: only register or adopt processes descending from this PID (or the PID
    itself). Unset: any process the coordinator may see, except the refused ones."""

    group_leader: str | None = Field(None, max_length=2048)
    """The group's leader's coordinator (``http://HOST:PORT``), for a follower pod of an
    engine that spans pods. Unset: from ``LWS_LEADER_ADDRESS`` (a LeaderWorkerSet's pods get
    it) on this coordinator's ``port``. A coordinator in no group (no group setting, no LWS
    variable) drains its pod alone. See docs/group.md."""
    group_size: int | None = Field(None, ge=1, le=1024)
    """Pods in the group, the leader included. Unset: ``LWS_GROUP_SIZE``. 1: no group."""
    group_index: int | None = Field(None, ge=0, le=1023)
    """This pod's index in its group, 0 for the leader. Unset: ``LWS_WORKER_INDEX``."""
    group_url: str | None = Field(None, max_length=2048)
    """How the group's other coordinators reach this one (announced to the leader, shown in
    its ``/status``; informational). Unset: not announced."""
    group_leader_timeout_s: float = Field(10.0, gt=0, le=3_600)
    """Seconds a follower whose drain has begun waits for an unreachable leader before it
    drains its pod on its own (and says so in its summary). 10 s: several of the leader's
    long-poll answers and connection attempts, well inside a 30 s grace period."""
    group_follower_share: float = Field(0.25, gt=0, lt=0.5)
    """Fraction of the budget the followers' kills keep after the leader's engine stopped
    (at least the SIGKILL confirmation and 1 s; at most half): the leader's drain gets the
    rest. Default 0.25: a 25 s budget leaves the leader 18.75 s."""
    group_engine_first: bool = True
    """On the group's leader, signal the engine's main processes (registered workers of
    role ``worker`` and adopted roots) first, in a tier of their own: a multi-node engine's
    front end stops issuing steps and stops its ranks in an order its collectives survive.
    Off: the usual children-first order."""

    state_file: Path | None = None
    """Where the drain's state is persisted (atomically) so a restarted coordinator resumes
    it. Unset: nothing is persisted."""

    doorbell: str = "auto"
    """The named pipe whose one write wakes every worker at a drain's start (see
    ``coordinator.service.doorbell``): ``auto`` (one per coordinator process in
    ``$XDG_RUNTIME_DIR`` or the temp directory), ``off``, or a path. In a pod, a path on an
    ``emptyDir`` mounted in the engine containers too; workers that cannot open it, or find
    another file there, learn of the drain from their event stream alone."""

    max_body_bytes: int = Field(8 * 1024 * 1024, ge=2 * 1024 * 1024, le=1024**3)
    """Largest request body accepted (413 above it, judged on ``Content-Length`` before a byte
    of the body is read). 8 MiB holds a report of 10,000 handoffs with short details. At
    least 2 MiB: ``worker_client`` splits its reports below that."""
    read_timeout_s: float = Field(10.0, gt=0, le=3_600)
    """Seconds a request's head (from the connection opening or the previous response) and,
    separately, its body may take to arrive; a slower one is closed (408 for a body)."""
    max_connections: int = Field(8192, ge=16, le=1_000_000)
    """Open connections at most; one more is answered 503 and closed. Each registered engine
    process holds one (its event stream), each waiting ``/status`` or ``/drain`` caller one."""

    max_workers: int = Field(1024, ge=1, le=100_000)
    """Registered workers at most (exited ones count until they expire); one more
    registration is answered 429. A pod runs a handful of engine processes, a host a few
    dozen: 1,024 leaves room for engines that crash and restart many times within
    ``expire_after_s``."""
    max_streams_per_worker: int = Field(4, ge=1, le=64)
    """Event streams one worker may hold open at once (429 past it). ``worker_client`` holds
    one, and briefly two while it reconnects."""
    max_handoffs: int = Field(10_000, ge=1, le=1_000_000)
    """Handed-back requests waiting for a router's acknowledgement at most; a report that
    would pass it is refused whole (429) and ``worker_client`` sends it again later. Far
    above what one pod holds in flight."""
    max_early_acks: int = Field(10_000, ge=1, le=1_000_000)
    """Acknowledgements of handoffs not reported yet, at most (429 past it)."""
    max_long_polls: int = Field(1024, ge=1, le=1_000_000)
    """``GET /status?wait=S`` callers waiting at once, at most (429 past it). Routers hold one
    each."""
    expire_after_s: float = Field(60.0, gt=0, le=86_400)
    """Seconds a handed-back request or an early acknowledgement waits for its counterpart,
    and an exited worker is kept (once nothing it started still runs), while no drain runs;
    then it expires (an expired handoff is counted ``expired``). During a drain the drain's
    budget governs instead. 60 s: far longer than a router takes to re-issue a request, short
    enough that nothing piles up."""

    long_poll_cap_s: float = Field(30.0, gt=0, le=3_600)
    """Upper bound on ``GET /status?wait=S``; longer waits are cut to it."""
    ping_interval_s: float = Field(15.0, gt=0, le=3_600)
    """Seconds between ``ping`` lines on the workers' event streams (keeps proxies and the
    client's read timeout happy)."""
    process_scan_interval_s: float = Field(5.0, gt=0, le=3_600)
    """Seconds between re-scans of the registered and adopted trees for ``/status``."""
    status_cache: bool = True
    """Serve ``/status`` from a per-generation cache. Off only to measure the cache."""
    log_level: str = "info"
    """uvicorn log level: critical, error, warning, info, debug, trace."""

    @model_validator(mode="before")
    @classmethod
    def _environment(cls, given: Any) -> Any:
        """What ``given`` leaves out, from the environment."""
        if not isinstance(given, dict):
            return given
        return {**from_environment(os.environ, cls.model_fields), **given}

    @field_validator("public_host")
    @classmethod
    def _public_address(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            address = ipaddress.ip_address(value.strip().strip("[]"))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (the pod's IP)") from None
        if address.is_loopback or address.is_unspecified:
            raise ValueError(f"{value!r} is loopback or a wildcard: the API is already "
                             "reachable there; give the pod's own address")
        return str(address)

    @field_validator("engine_metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        if value is not None and any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError(f"{value!r} holds a control character or whitespace (CR, LF, ...)")
        return value

    @field_validator("engine_url")
    @classmethod
    def _engine_url(cls, value: str | None) -> str | None:
        return http_url(value) if value is not None else None

    @field_validator("group_leader", "group_url")
    @classmethod
    def _group_url(cls, value: str | None) -> str | None:
        return http_url(value) if value is not None else None

    @field_validator("router_worker_url")
    @classmethod
    def _worker_url(cls, value: str | None) -> str | None:
        return http_url(value) if value is not None else None

    @field_validator("routers", mode="before")
    @classmethod
    def _routers_from_text(cls, value: Any) -> Any:
        if value is None:
            return []
        return [parse_router(item) if isinstance(item, str) else item
                for item in _split_list(value)]

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip() or any(c.isspace() or not c.isprintable() for c in name) \
                    or len(name) > 253:
                raise ValueError(f"{name!r} is not a host name")
        return value

    @field_validator("adopt_pids", "adopt_patterns", "engine_inflight_metrics",
                     "allowed_hosts", mode="before")
    @classmethod
    def _lists_from_env(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("adopt_tiers", mode="before")
    @classmethod
    def _tiers_from_text(cls, value: Any) -> Any:
        return parse_tiers(value) if value is not None else []

    @field_validator("adopt_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            patterns.compile_pattern(pattern)
        return value

    @model_validator(mode="after")
    def _engine_profile(self) -> Settings:
        """What the operator left unset, from the engine's profile."""
        profile = PROFILES[self.engine]
        given = self.model_fields_set
        if "adopt_patterns" not in given and profile.adopt_patterns:
            self.adopt_patterns = list(profile.adopt_patterns)
        if "adopt_tiers" not in given and profile.tiers:
            self.adopt_tiers = list(profile.tiers)
        if "engine_metrics_url" not in given and profile.metrics_url:
            self.engine_metrics_url = profile.metrics_url
        if "engine_inflight_metrics" not in given and profile.inflight_metrics:
            self.engine_inflight_metrics = list(profile.inflight_metrics)
        if "engine_url" not in given and profile.api_url:
            self.engine_url = profile.api_url
        if self.end_streams:
            if profile.ender is None:
                raise ValueError(f"end_streams: the {profile.name} profile knows no call that "
                                 "ends the engine's requests (sglang and vllm do: --engine)")
            if not self.engine_url or not self.engine_metrics_url:
                raise ValueError("end_streams needs the engine's API (engine_url) and its "
                                 "in-flight gauges (engine_metrics_url)")
        return self

    @model_validator(mode="after")
    def _group(self) -> Settings:
        """The group settings and the LeaderWorkerSet environment must make a group, or
        none (``coordinator.group.membership``)."""
        membership(self, os.environ)
        return self

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"critical", "error", "warning", "info", "debug", "trace"}:
            raise ValueError(f"unknown log level {value!r}")
        return level
