"""The drain's outcome: one word for scripts, and every cause as a plain sentence for people.

Pure: it reads the processes' outcomes (``coordinator.kill.report``), the count of
handed-back requests that expired unacknowledged and the drain's internal failures, and
nothing else (no clock, no I/O).

A drain is ``graceful`` only when all of these hold (DESIGN.md, "Outcome"):

- no process needed SIGKILL (``killed``) or is ``survived``/``running``;
- no process died by a signal other than its graceful one (its own SIGKILL, SIGSEGV,
  SIGABRT, ...). A process's graceful signal is the one the coordinator sent it (its
  ``signal``); a process the coordinator did not signal may also die of a graceful signal
  this drain sent to others (its parent passed the stop on). Dying of the graceful signal is
  accepted for a child, though no handler ran and so no cleanup (``default_action_death``);
- no process exited non-zero;
- every root (``depth == 0``: a registered or adopted main process, whose container reports
  its code) exited 0. A root that died of its graceful signal (exit -15: the container says
  143), exited 143, or whose exit code is unknown, did not. An unknown code is never taken
  for 0: it gives ``unverified`` (the kernel could not tell, so an exit 0 cannot be claimed).
  The orphans of a root that died before the drain are kill targets of their own
  (``depth == 0``, role ``orphan``) but no container reports their code: they are judged as
  children;
- no handed-back request expired unacknowledged and no request an adopted engine still had in
  flight was cut by the kill (``lost_requests == 0``, ``cut_requests`` counted in it);
- the drain had no internal failure (``errors``);
- at least one process was known (otherwise ``nothing_to_drain``).

A process that died of a SIGKILL the coordinator never sent was killed by its own engine (a
``kill_process_tree`` of its parent, or ``PR_SET_PDEATHSIG`` when its parent ended): the cause
says so, with what the engine's profile tells of it and how to end it cleanly
(``engine_kills``), apart from the children of a main process the coordinator SIGKILLed, which
died with it.

When several causes apply, the outcome is the first of ``PRECEDENCE`` present; ``causes``
lists every one, in that order. ``aborted`` and ``timeout`` are not judged here: the drain
controller and the HTTP layer set them (the drain never reached a judgement).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.kill.report import Fate, ProcessOutcome

GRACEFUL = "graceful"
"""Every rule above holds."""
SURVIVED = "survived"
"""A process was still there at the end (``survived``, or never settled: ``running``)."""
KILLED = "killed"
"""A process needed SIGKILL (outlived its tier, the deadline, or a force drain)."""
SIGNALLED = "signalled"
"""A process died by a signal other than its graceful one (no cleanup ran in it)."""
FAILED = "failed"
"""A process exited non-zero, or a root did not exit 0 (it died of its graceful signal)."""
LOST_REQUESTS = "lost_requests"
"""Handed-back requests expired unacknowledged (no router said it continued them), or requests
an adopted engine still had in flight were cut by the kill."""
ERROR = "error"
"""The drain itself failed internally (what it knows is reported, but it may not be all)."""
UNVERIFIED = "unverified"
"""Everything else was clean, but a root's exit code could not be learned."""
NOTHING_TO_DRAIN = "nothing_to_drain"
"""No process was registered or adopted: the drain ended nothing."""
ABORTED = "aborted"
"""Set by the controller: the drain was aborted and the coordinator is serving again."""
TIMEOUT = "timeout"
"""Set by the HTTP layer: a blocking drain call's wait ran past the budget."""

PRECEDENCE: tuple[str, ...] = (
    SURVIVED, KILLED, SIGNALLED, FAILED, LOST_REQUESTS, ERROR, UNVERIFIED, NOTHING_TO_DRAIN,
)
"""Non-graceful outcomes, most severe first: the first one that applies is the outcome."""

OUTCOMES: tuple[str, ...] = (GRACEFUL, *PRECEDENCE, ABORTED, TIMEOUT)
"""Every outcome word a drain can end with."""

ORPHAN_ROLE = "orphan"
"""The role the service gives the re-parented children of a root that died before the kill."""

LISTED_MAX = 10
"""Processes named in one cause sentence; the rest are counted."""


@dataclass(frozen=True)
class Verdict:
    """The judgement of one drain."""

    outcome: str
    """``graceful``, or the first of ``PRECEDENCE`` that applies."""
    causes: tuple[str, ...]
    """One plain sentence per cause, naming processes, codes and counts; empty when graceful."""
    lost_requests: int

    @property
    def graceful(self) -> bool:
        return self.outcome == GRACEFUL

    def to_dict(self) -> dict[str, Any]:
        """The keys ``/status`` carries in ``drain``: ``outcome``, ``causes``, ``lost_requests``."""
        return {"outcome": self.outcome, "causes": list(self.causes),
                "lost_requests": self.lost_requests}


def judge(
    processes: Sequence[ProcessOutcome],
    *,
    lost_requests: int = 0,
    cut_requests: int = 0,
    errors: Sequence[str] = (),
    force: bool = False,
    engine_kills: str = "",
) -> Verdict:
    """The outcome of a drain whose kill reported ``processes`` (see the module docstring).

    ``lost_requests`` counts every request whose client was cut off, the ``cut_requests`` an
    adopted engine still had in flight when the kill ended it among them (each kind gets its
    own sentence). ``force``: the drain was a force drain, so a process that died of SIGKILL
    before the coordinator's own SIGKILL reached it (a ``PR_SET_PDEATHSIG`` child of a
    SIGKILLed parent) counts as ``killed`` like the rest, not as ``signalled``.
    ``engine_kills``: what the engine's profile says of the SIGKILLs it sends its own tree.
    """
    if lost_requests < 0 or cut_requests < 0:
        raise ValueError(f"request counts must be >= 0, not {lost_requests}, {cut_requests}")
    lost_requests = max(lost_requests, cut_requests)
    graceful_signals = frozenset(p.signal for p in processes if p.signal)
    killed_roots = frozenset(p.pid for p in processes if _is_root(p) and p.killed_at is not None)
    groups: dict[tuple[str, str], list[ProcessOutcome]] = {}
    for process in processes:
        finding = _finding(process, graceful_signals, force=force, killed_roots=killed_roots,
                           engine_kills=engine_kills)
        if finding is not None:
            groups.setdefault(finding, []).append(process)
    found: list[tuple[str, str]] = [(word, _sentence(members, reason))
                                    for (word, reason), members in groups.items()]
    if cut_requests:
        found.append((LOST_REQUESTS, _cut_sentence(cut_requests)))
    if lost_requests > cut_requests:
        found.append((LOST_REQUESTS, _lost_sentence(lost_requests - cut_requests)))
    found += [(ERROR, f"The drain failed internally: {_clause(e)}.") for e in errors]
    if not processes:
        found.append((NOTHING_TO_DRAIN, "No process was registered or adopted, so the drain "
                      "ended nothing: check the workers' registration and --adopt-pid or "
                      "--adopt-pattern."))
    found.sort(key=lambda item: PRECEDENCE.index(item[0]))  # stable: first seen first
    outcome = found[0][0] if found else GRACEFUL
    return Verdict(outcome, tuple(sentence for _, sentence in found), lost_requests)


def default_action_death(p: ProcessOutcome) -> bool:
    """True when ``p`` died of the graceful signal it was sent, by that signal's default
    action: it had no handler (or its handler re-raised it), so its cleanup did not run."""
    signum = _signum(p.signal)
    return signum is not None and p.exit_code == -signum


# --- one process ----------------------------------------------------------------------------


def _is_root(p: ProcessOutcome) -> bool:
    return p.depth == 0 and p.role != ORPHAN_ROLE


def _finding(
    p: ProcessOutcome, graceful_signals: frozenset[str], *, force: bool,
    killed_roots: frozenset[int] = frozenset(), engine_kills: str = "",
) -> tuple[str, str] | None:
    """``(outcome word, reason)`` for one process, or None when it ended acceptably. A
    process gives at most one finding: its most severe."""
    root = _is_root(p)
    if p.fate is Fate.SURVIVED:
        after = ", even after SIGKILL" if p.killed_at is not None else ""
        return SURVIVED, f"did not end by the deadline{after}"
    if p.fate is Fate.RUNNING:
        return SURVIVED, "had not ended when the kill stopped watching"
    if p.fate is Fate.KILLED:
        return KILLED, _killed_reason(p, force=force)
    code = p.exit_code
    if code is None:
        if root:
            return UNVERIFIED, ("ended, but its exit code could not be learned, so an exit 0 "
                                "cannot be confirmed")
        return None
    if code < 0:
        return _signal_finding(p, graceful_signals, root=root, force=force,
                               killed_roots=killed_roots, engine_kills=engine_kills)
    if code > 0:
        return FAILED, f"exited with code {code}{_shell_signal_note(code)}"
    return None


def _killed_reason(p: ProcessOutcome, *, force: bool) -> str:
    if force:
        return "got SIGKILL from the force drain"
    if p.signal:
        return f"did not end in time after {p.signal} and needed SIGKILL"
    return "needed SIGKILL before any graceful signal (no time was left for one)"


def _signal_finding(
    p: ProcessOutcome, graceful_signals: frozenset[str], *, root: bool, force: bool,
    killed_roots: frozenset[int] = frozenset(), engine_kills: str = "",
) -> tuple[str, str] | None:
    assert p.exit_code is not None
    signum = -p.exit_code
    died = _signame(signum)
    container = f"; its container reports {128 + signum}" if root else ""
    if force and signum == signal.SIGKILL:
        return KILLED, f"died of SIGKILL during the force drain (exit {p.exit_code})"
    if signum == signal.SIGKILL and p.killed_at is None:
        if not root and p.root_pid in killed_roots:
            return SIGNALLED, ("died of SIGKILL with its main process, which the coordinator "
                               "SIGKILLed (exit -9), so its exit-time cleanup did not run")
        # Never sent by the coordinator: its engine's own kill (or PDEATHSIG of its parent).
        fix = f" ({_clause(engine_kills)})" if engine_kills else ""
        return SIGNALLED, (f"died of a SIGKILL sent by the engine itself, not by the "
                           f"coordinator (exit -9{container}), so no exit-time cleanup ran"
                           f"{fix}")
    sent = p.signal
    graceful = died == sent if sent else died in graceful_signals
    if graceful:
        if not root:
            return None  # accepted: the per-process detail says no cleanup ran
        return FAILED, (f"died of {died}'s default action (exit {p.exit_code}{container}): "
                        "no handler ran, so it did not exit 0")
    what = f"not of the {sent} it was sent" if sent else "a signal the drain never sent it"
    return SIGNALLED, (f"died of {died} (exit {p.exit_code}{container}), {what}, so its "
                       "exit-time cleanup did not run")


def _shell_signal_note(code: int) -> str:
    """``143 = 128 + 15``: how a shell (or a container runtime) reports a death by a signal."""
    name = _known_signame(code - 128)
    return "" if name is None else f" (128 + {code - 128}: how a shell reports a death by {name})"


# --- sentences ------------------------------------------------------------------------------


def _label(p: ProcessOutcome) -> str:
    kind = "main process" if _is_root(p) else "process"
    return f"{kind} {p.name or '?'} (pid {p.pid})"


def _sentence(members: list[ProcessOutcome], reason: str) -> str:
    if len(members) == 1:
        label = _label(members[0])
        return f"{label[0].upper()}{label[1:]} {reason}."
    named = ", ".join(_label(p) for p in members[:LISTED_MAX])
    more = len(members) - LISTED_MAX
    if more > 0:
        named += f", and {more} more"
    return f"{len(members)} processes {reason}: {named}."


def _lost_sentence(count: int) -> str:
    if count == 1:
        return ("1 handed-back request expired unacknowledged: no router said it continued it "
                "before the drain ended, so its client was cut off unless one did later.")
    return (f"{count} handed-back requests expired unacknowledged: no router said it continued "
            "them before the drain ended, so their clients were cut off unless one did later.")


def _cut_sentence(count: int) -> str:
    what = "1 request" if count == 1 else f"{count} requests"
    verb = "was" if count == 1 else "were"
    return (f"{what} the engine still had in flight by its own count when its processes "
            f"ended {verb} cut by the kill: {'its client' if count == 1 else 'their clients'} "
            "got no complete answer.")


def _clause(text: str) -> str:
    return text.strip().rstrip(".") or "unknown error"


def _signum(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return int(signal.Signals[name])
    except KeyError:
        return None


def _known_signame(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def _signame(signum: int) -> str:
    return _known_signame(signum) or f"signal {signum}"
