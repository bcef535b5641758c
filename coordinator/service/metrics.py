"""Prometheus metrics of the coordinator (a registry per app, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from coordinator.drain.phases import Phase

CONTENT_TYPE = CONTENT_TYPE_LATEST
_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300)
_EVENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
"""The push that sets ``shutdown_event`` takes milliseconds; seconds mean trouble."""


class DrainClock(Collector):
    """The running drain's budget and how long it has run, read when scraped: a drain past
    its budget (elapsed > budget) is one the deadline did not end. No samples while no
    drain runs. ``source`` returns (elapsed s, budget s) of the running drain, or None."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[float, float] | None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        running = self.source()
        elapsed = GaugeMetricFamily("shutdown_coordinator_drain_elapsed_seconds",
                                    "Seconds since the running drain started (absent when "
                                    "none runs)")
        budget = GaugeMetricFamily("shutdown_coordinator_drain_budget_seconds",
                                   "The running drain's budget in seconds (absent when none "
                                   "runs)")
        if running is not None:
            elapsed.add_metric([], running[0])
            budget.add_metric([], running[1])
        yield elapsed
        yield budget


class CoordinatorMetrics:
    """Counters and histograms of drains, phases, process fates, migrations, state file
    writes, cycles, limits reached and router calls."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drains = Counter("shutdown_coordinator_drains", "Drains by outcome",
                              ["outcome"], registry=r)
        self.drains_started = Counter("shutdown_coordinator_drains_started",
                                      "Drains started", registry=r)
        self.drain_seconds = Histogram("shutdown_coordinator_drain_seconds",
                                       "Drain duration from start to done or abort",
                                       buckets=_PHASE_BUCKETS, registry=r)
        self.phase_seconds = Histogram("shutdown_coordinator_phase_seconds",
                                       "Time spent in each drain phase", ["phase"],
                                       buckets=_PHASE_BUCKETS, registry=r)
        self.fates = Counter("shutdown_coordinator_process_fates",
                             "Processes ended by a drain, by fate", ["fate"], registry=r)
        self.migrations = Counter("shutdown_coordinator_migrations",
                                  "Handed-back requests by event (handed_back, acked, expired)",
                                  ["event"], registry=r)
        self.shutdown_event_seconds = Histogram(
            "shutdown_coordinator_shutdown_event_seconds",
            "Time from a drain's start to a worker's shutdown_event being set, as the worker "
            "reports it (notified_at), once per worker and drain",
            buckets=_EVENT_BUCKETS, registry=r)
        self.workers = Gauge("shutdown_coordinator_workers", "Registered workers", registry=r)
        self.phase = Gauge("shutdown_coordinator_phase", "1 for the current phase",
                           ["phase"], registry=r)
        self.state_writes = Counter("shutdown_coordinator_state_writes",
                                    "State file writes that reached the disk", registry=r)
        self.state_write_failures = Counter(
            "shutdown_coordinator_state_write_failures",
            "State file writes that failed (the drain went on; retried)", registry=r)
        self.state_files_unusable = Counter(
            "shutdown_coordinator_state_files_unusable",
            "State files found unusable at start-up (moved aside; started fresh)", registry=r)
        self.new_cycles = Counter(
            "shutdown_coordinator_new_cycles",
            "Finished drains whose cycle ended, back to serving, by trigger "
            "(registration, restart, dismissed: DELETE /drain after nothing to drain)",
            ["trigger"], registry=r)
        self.limit_refusals = Counter(
            "shutdown_coordinator_limit_refusals",
            "Requests answered 429 because a bounded collection was full, by its setting "
            "(max_workers, max_handoffs, max_early_acks, max_long_polls, "
            "max_streams_per_worker)", ["limit"], registry=r)
        self.streams_ended = Counter(
            "shutdown_coordinator_streams_ended",
            "Streams of a stock engine ended for the proxy in front (--end-streams), by event "
            "(ended: by the engine's abort call; continued: the proxy took one over; failed: "
            "a call the engine did not take)",
            ["event"], registry=r)
        self.router_calls = Counter(
            "shutdown_coordinator_router_calls",
            "Calls to the routers in front of the engine (--router), by router kind, action "
            "(remove, restore) and result (ok, failed, cancelled, not_needed)",
            ["router", "action", "result"], registry=r)
        self.router_call_seconds = Histogram(
            "shutdown_coordinator_router_call_seconds",
            "Time from a drain's start (or abort) to the router's answer, retries included",
            ["router", "action"], buckets=_EVENT_BUCKETS, registry=r)
        self.drain_clock = DrainClock()
        r.register(self.drain_clock)
        self.set_phase(Phase.SERVING)

    def set_phase(self, current: Phase) -> None:
        for phase in Phase:
            self.phase.labels(phase.value).set(1 if phase is current else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
