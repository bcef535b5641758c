"""What to kill and how: targets, tiers and the kill policy (plain data, no behaviour)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from coordinator.kill.report import ProcessOutcome

DEFAULT_TIER_TIMEOUT_S = 10.0
"""Seconds a tier gets between its graceful signal and SIGKILL. SGLang's own default for
``SGLANG_CHILD_PROCESS_SHUTDOWN_TIMEOUT``; RDMA teardown may need more (set it per tier)."""

DEFAULT_CONFIRM_S = 2.0
"""Seconds to wait for a SIGKILLed process to disappear before calling it ``survived``."""


@dataclass(frozen=True)
class TierSpec:
    """One step of the ordered kill, declared by a worker at registration.

    A process belongs to the first tier whose ``roles`` contains its role or whose
    ``pattern`` (a regular expression, searched in ``name + " " + cmdline``) matches it.
    Tiers run in the order given; processes matched by no tier are handled by the
    default order (deepest first) before the root, and the root ends last unless a tier with
    ``include_root`` matches it.
    """

    name: str
    pattern: str | None = None
    roles: tuple[str, ...] = ()
    signal: int = signal.SIGTERM
    timeout_s: float = DEFAULT_TIER_TIMEOUT_S
    include_root: bool = False
    """Opt-in: a root this tier matches is signalled in this tier's place instead of last.
    For engines whose main process stops its own children best (SGLang's
    ``graceful_kill_process_tree``)."""


@dataclass(frozen=True)
class Target:
    """A root process to terminate together with its descendants."""

    pid: int
    start_time: float | None = None
    """Expected start time (epoch s, as psutil reports it). When given and the live process's
    start time differs, the PID was reused: the target is reported ``gone`` and left alone."""
    role: str = "worker"
    tiers: tuple[TierSpec, ...] = ()
    include_tree: bool = True
    """Also terminate the root's descendants (re-enumerated until no new PID appears)."""
    listed: tuple[ProcessOutcome, ...] = ()
    """Descendants a scan listed under this root before the kill: each one the kill does not
    find is still reported (``coordinator.kill.listed``), never left out of the report."""
    reach_uid: int | None = None
    """The UID whose reach bounds this tree: a process found under the root (descendant,
    session, group or unit) is taken only if that UID could signal it (``kill(2)``: its real
    or saved UID). None: no bound (a root trusted by the token or registered by root)."""


@dataclass(frozen=True)
class KillPolicy:
    """How the kill engine runs one kill."""

    signal: int = signal.SIGTERM
    """Graceful signal for tiers that do not name their own."""
    tier_timeout_s: float = DEFAULT_TIER_TIMEOUT_S
    """Timeout of each default (depth) tier."""
    deadline_s: float = 30.0
    """Overall budget for the whole kill; tier timeouts are cut to fit it."""
    force: bool = False
    """Operator's quick stop: SIGKILL everything at once, no graceful tier."""
    confirm_s: float = DEFAULT_CONFIRM_S
    extra_tiers: tuple[TierSpec, ...] = field(default_factory=tuple)
    """Tiers that apply to every target (after each target's own tiers)."""
