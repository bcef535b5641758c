"""Pure tier planning: which process goes in which tier, in which order, and for how long.

Nothing here touches a process or a clock; the engine passes in what it discovered and the
current time, so every rule is tested as a plain function.

Order of a plan:

1. declared tiers (each target's own ``TierSpec``s, then the policy's ``extra_tiers``), in the
   order they were declared; tiers of the same name from several targets run together;
2. every other non-root process by depth, deepest first (``depth-3``, ``depth-2``, ...), so a
   parent never dies before its ``PR_SET_PDEATHSIG`` children finished their cleanup;
3. the roots (``roots``), last, so the registered main process can exit 0.

A root joins a declared tier's place in the order only when that tier opts in
(``include_root``); otherwise a declared tier that matches it lends it its signal and timeout
and it still ends last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.kill import patterns
from coordinator.kill.policy import TierSpec

ROOTS_TIER = "roots"


@dataclass(frozen=True, slots=True)
class Member:
    """A discovered process, as the planner sees it."""

    pid: int
    parent_pid: int | None
    depth: int
    """0 for a root, 1 for its children, and so on."""
    name: str
    cmdline: str
    role: str | None
    root_pid: int

    @property
    def is_root(self) -> bool:
        return self.depth == 0


@dataclass(frozen=True, slots=True)
class PlannedTier:
    """One step of the kill: signal these processes, wait up to ``timeout_s``."""

    name: str
    timeout_s: float
    signals: tuple[tuple[int, int], ...]
    """``(pid, signal)`` for each member, in discovery order."""
    holds_roots: bool = False
    """A root is among its members (the ``roots`` tier, or a declared ``include_root`` tier
    that matched one): the main processes' tier (``main_tier_index``)."""

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(pid for pid, _ in self.signals)


def depth_tier_name(depth: int) -> str:
    return f"depth-{depth}"


def matches(spec: TierSpec, member: Member) -> bool:
    """True when ``member`` belongs to ``spec`` by role or by pattern. A pattern RE2 does
    not accept (one restored from a state file that was edited, or written by another RE2)
    matches nothing: its processes are stopped in the default order, never left alone."""
    if member.role is not None and member.role in spec.roles:
        return True
    if spec.pattern is not None:
        try:
            return patterns.search(spec.pattern, f"{member.name} {member.cmdline}")
        except patterns.PatternError:
            return False
    return False


def match_tier(member: Member, specs: Sequence[TierSpec]) -> TierSpec | None:
    """The first tier of ``specs`` that ``member`` belongs to."""
    for spec in specs:
        if matches(spec, member):
            return spec
    return None


def plan_tiers(
    members: Iterable[Member],
    specs_by_root: Mapping[int, Sequence[TierSpec]],
    *,
    default_signal: int,
    default_timeout_s: float,
) -> list[PlannedTier]:
    """Order ``members`` into tiers (see the module docstring). Empty tiers are left out.

    ``specs_by_root`` gives, for each root PID, the tiers that apply to its tree (its own
    tiers followed by the policy's extra tiers).
    """
    declared_order: list[str] = []
    declared: dict[str, list[tuple[int, int]]] = {}
    declared_timeout: dict[str, float] = {}
    declared_roots: set[str] = set()
    by_depth: dict[int, list[tuple[int, int]]] = {}
    roots: list[tuple[int, int]] = []
    roots_timeout: float | None = None

    for spec_list in specs_by_root.values():
        for declared_spec in spec_list:
            name, timeout_s = declared_spec.name, declared_spec.timeout_s
            if name not in declared:
                declared_order.append(name)
                declared[name] = []
                declared_timeout[name] = timeout_s
            else:
                declared_timeout[name] = max(declared_timeout[name], timeout_s)

    for member in members:
        spec = match_tier(member, specs_by_root.get(member.root_pid, ()))
        if member.is_root and spec is not None and spec.include_root:
            declared[spec.name].append((member.pid, spec.signal))
            declared_roots.add(spec.name)
        elif member.is_root:
            sig = spec.signal if spec else default_signal
            timeout = spec.timeout_s if spec else default_timeout_s
            roots.append((member.pid, sig))
            roots_timeout = timeout if roots_timeout is None else max(roots_timeout, timeout)
        elif spec is not None:
            declared[spec.name].append((member.pid, spec.signal))
        else:
            by_depth.setdefault(member.depth, []).append((member.pid, default_signal))

    plan = [
        PlannedTier(name, declared_timeout[name], tuple(declared[name]),
                    holds_roots=name in declared_roots)
        for name in declared_order
        if declared[name]
    ]
    plan += [
        PlannedTier(depth_tier_name(depth), default_timeout_s, tuple(by_depth[depth]))
        for depth in sorted(by_depth, reverse=True)
    ]
    if roots:
        timeout = default_timeout_s if roots_timeout is None else roots_timeout
        plan.append(PlannedTier(ROOTS_TIER, timeout, tuple(roots), holds_roots=True))
    return plan


def main_tier_index(plan: Sequence[PlannedTier]) -> int:
    """The index of the main processes' tier: the first that holds a root, the last tier when
    none does (the roots are gone). It keeps its reserve (``last_tier_reserve_s``) against the
    tiers before it, and the tiers after it (what outlives the main processes: an engine that
    stops its own children leaves none) keep nothing from it: with the root first
    (``include_root``, SGLang's and Dynamo's profiles) the main process may wait out the whole
    deadline for its own graceful exit."""
    return next((i for i, tier in enumerate(plan) if tier.holds_roots), len(plan) - 1)


def confirm_reserve(deadline_s: float, confirm_s: float) -> float:
    """Seconds kept back from graceful waiting so SIGKILL and its confirmation fit the deadline.

    The confirmation wait, but never more than a fifth of the whole budget: a short deadline
    still leaves most of its time to graceful exits.
    """
    return max(0.0, min(confirm_s, deadline_s / 5))


LAST_TIER_SHARE = 0.5
"""Share of the kill's usable time (its deadline less the SIGKILL reserve) the main processes'
tier keeps for itself, never more than its own timeout. That tier (``main_tier_index``: the
roots' tier, last by default) holds the registered main processes, whose exit code is the
container's: a stubborn child earlier in the order must not take the time the main process
needs to get its graceful signal and exit 0."""


def last_tier_reserve_s(*, usable_s: float, last_timeout_s: float) -> float:
    """Seconds set aside for the main processes' tier when the kill starts (fixed for the
    whole kill, so it does not shrink as the tiers before it use their time)."""
    return max(0.0, min(last_timeout_s, LAST_TIER_SHARE * usable_s))


def kept_for_later_s(
    *, left_s: float, later_timeouts: Sequence[float], last_reserve_s: float
) -> float:
    """Seconds of ``left_s`` the current tier must leave to the tiers after it, up to the main
    processes' tier (``later_timeouts`` ends with that tier's; the tiers after it keep nothing).

    The last of ``later_timeouts`` keeps ``last_reserve_s``; the others between share what
    remains fairly with the current tier (each keeps at most its own timeout), so every tier
    still gets its graceful signal and a wait.
    """
    if not later_timeouts:
        return 0.0
    *between, _last = later_timeouts
    available = max(0.0, left_s - last_reserve_s)
    share = available / (len(between) + 1)
    return last_reserve_s + sum(min(t, share) for t in between)


def allotted_wait_s(
    *,
    now: float,
    tier_started_at: float,
    timeout_s: float,
    deadline_at: float,
    reserve_s: float,
    later_timeouts: Sequence[float] = (),
    last_reserve_s: float = 0.0,
) -> float:
    """How long the current tier may wait for graceful exits before SIGKILL.

    Its own timeout (counted from ``tier_started_at``), cut to what is left of the deadline
    once the SIGKILL reserve and what the later tiers keep (``kept_for_later_s``) are taken
    out. The last tier (no ``later_timeouts``) gets everything that is left. Never negative.
    """
    left = deadline_at - reserve_s - now
    kept = kept_for_later_s(left_s=left, later_timeouts=later_timeouts,
                            last_reserve_s=last_reserve_s)
    tier_left = tier_started_at + timeout_s - now
    return max(0.0, min(tier_left, left - kept))


def confirm_wait_s(
    *, now: float, deadline_at: float, confirm_s: float, kept_s: float = 0.0
) -> float:
    """How long to wait for SIGKILLed processes to vanish: ``confirm_s``, cut to the deadline
    less ``kept_s`` (what the later tiers keep, so a process stuck in the kernel cannot take
    their time)."""
    return max(0.0, min(confirm_s, deadline_at - kept_s - now))


def planned_waits(
    timeouts: Sequence[float], *, deadline_s: float, confirm_s: float, stubborn: bool
) -> list[float]:
    """How long each tier of a kill with ``deadline_s`` would wait between its graceful
    signal and SIGKILL, by the rules above (``allotted_wait_s``), as the kill engine applies
    them tier after tier: with ``stubborn``, every process outlives its wait (the least a
    tier gets: each one before it takes all it may); without, every process exits at its
    signal (the most: the time left is the whole deadline at each tier's start)."""
    if not timeouts:
        return []
    reserve = confirm_reserve(deadline_s, confirm_s)
    last_reserve = last_tier_reserve_s(usable_s=deadline_s - reserve,
                                       last_timeout_s=timeouts[-1])
    now = 0.0
    waits = []
    for index, timeout in enumerate(timeouts):
        wait = allotted_wait_s(now=now, tier_started_at=now, timeout_s=timeout,
                               deadline_at=deadline_s, reserve_s=reserve,
                               later_timeouts=timeouts[index + 1:],
                               last_reserve_s=last_reserve)
        waits.append(wait)
        if stubborn:
            now += wait  # SIGKILLed at the end of it (a SIGKILL ends a process at once)
    return waits
