"""What really happened to a drained engine, from outside the coordinator, and whether the
drain's summary says so (``bench/soak.py``).

Ground truth, never the coordinator's own report:

- the engine's processes: the ready file, every end record in its record directory
  (``devstack/sim/records.py``), and the PIDs records name (``children``, ``daemons``);
- each process's own end record: its cleanup ran to the end after SIGTERM, or not (a
  SIGKILL ended it);
- exit codes as someone outside saw them: the main process's ``Popen.wait()`` here, a
  child's as its parent recorded it (``children_exit_codes``), an orphan's as this process
  reaped it (it is a child subreaper); otherwise unknown (a record's own ``exit_code`` is
  what the process meant to exit with: a SIGKILL may still come after it is written);
- ``/proc`` and the pod's unit (cgroup): nothing may still run after ``done``.

A process whose cleanup finished (and that did not die of SIGKILL on its way out after it)
must be ``exited``. One that did not was ended by a SIGKILL: the coordinator's (``killed``),
or, in a crash, its parent's death before the drain's kill (``gone``); a force drain may
report either. The outcome a truthful summary must carry
follows from the truth the way ``coordinator/drain/outcome.py`` judges it.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.soak_rig import Unit, reap, start_ticks, stat_fields
from devstack.sim.launcher import EngineHandle

NORMAL, FORCE, CRASH = "normal", "force", "crash"
"""How the drained engine was meant to end: by the drain, a force drain, or a crash first."""
SETTLE_S = 5.0
"""How long a zombie of someone else's (PID 1) may take to be reaped before it counts."""
PRECEDENCE = ("survived", "killed", "signalled", "failed", "lost_requests")


@dataclass(frozen=True)
class Ending:
    """How one engine process ended, as seen from outside the coordinator."""

    pid: int
    role: str
    clean: bool
    """Its own record says its cleanup finished after SIGTERM, and nothing outside saw it
    die of a signal afterwards."""
    exit_code: int | None
    """As its parent (or this process) saw it; None when unknown."""
    fates: frozenset[str]
    """The fates a truthful summary may give it."""
    root: bool


def engine_pids(engine: EngineHandle, ticks: Mapping[int, int]) -> dict[int, int | None]:
    """Every process of the engine, with its start ticks where they were read while it ran."""
    pids: dict[int, int | None] = {p.pid: ticks.get(p.pid) for p in engine.processes}
    for record in engine.records():
        for pid in [record["pid"], *record.get("children", ()), *record.get("daemons", ())]:
            pids.setdefault(int(pid), ticks.get(int(pid)))
    return pids


def running_as(pid: int, ticks: int | None) -> bool:
    """``pid`` still runs (not a zombie), as the process that started at ``ticks``."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def zombie_parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields is not None and fields[0] == "Z" else None


def processes_left(pids: Mapping[int, int | None], unit: Unit, waited: set[int],
                   reaped: dict[int, int]) -> list[str]:
    """What still runs of the engine after its drain: a process listed in ``pids`` (the
    same one: start ticks), or anything in its unit. Zombies of ours are reaped (their codes
    go to ``reaped``; never those in ``waited``, whose ``Popen`` waits for them); a zombie
    of someone else's is waited for a moment, then counts."""
    for pid in pids:
        if pid in waited:
            continue
        code = reap(pid)
        if code is not None:
            reaped[pid] = code
    left = [f"{pid} ({_describe(pid)})" for pid, ticks in pids.items() if running_as(pid, ticks)]
    zombies = [pid for pid in pids if zombie_parent(pid) not in (None, os.getpid())]
    for pid in zombies:
        if _still_zombie(pid):
            left.append(f"{pid} (a zombie of {zombie_parent(pid)} nobody reaped)")
    for pid in unit.members():
        if pid in pids:
            continue
        code = reap(pid)
        if code is not None:
            reaped[pid] = code
        elif running_as(pid, None):
            left.append(f"{pid} ({_describe(pid)}, in the pod's {unit.kind})")
    return left


def _still_zombie(pid: int) -> bool:
    """Whether ``pid`` is still a zombie after ``SETTLE_S`` (its parent, PID 1 say, had
    time to reap it; no exit event tells when a zombie is reaped)."""
    deadline = time.monotonic() + SETTLE_S
    while zombie_parent(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return zombie_parent(pid) is not None


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


# --- the truth ------------------------------------------------------------------------------


def endings(engine: EngineHandle, pids: Iterable[int], main_code: int | None,
            reaped: Mapping[int, int], mode: str) -> dict[int, Ending]:
    """How each process of the engine ended (see the module docstring)."""
    records = {int(r["pid"]): r for r in engine.records()}
    seen_by_parent: dict[int, int] = {}
    for record in records.values():
        for pid, code in (record.get("children_exit_codes") or {}).items():
            if code is not None:
                seen_by_parent[int(pid)] = int(code)
    main_record = records.get(engine.pid) or {}
    # The main process SIGKILLs its tree and itself when a child exits while its watchdog is
    # armed: its record says so, or at least that the watchdog was never stood down.
    watchdog_fired = str(main_record.get("detail", "")).startswith("watchdog") or (
        main_record.get("watchdog") != "stood_down" and main_code == -signal.SIGKILL
        and mode == NORMAL)
    out: dict[int, Ending] = {}
    for pid in pids:
        record = records.get(pid) or {}
        cleaned = record.get("cleanup") == "finished" and "SIGTERM" in record.get("signals", ())
        # Not the record's own exit_code: a process can be SIGKILLed after writing it, on
        # its way out (then it ran its cleanup, but did not end in time all the same).
        code = main_code if pid == engine.pid else seen_by_parent.get(pid, reaped.get(pid))
        clean = cleaned and (code is None or code >= 0)
        fates = _fates(clean, mode, watchdog_fired)
        if cleaned and code is None:  # nobody outside saw how it ended
            fates |= _fates(False, mode, watchdog_fired)
        out[pid] = Ending(pid, str(record.get("role", "?")), clean, code, fates,
                          pid == engine.pid)
    return out


def registered_ending(pid: int, code: int | None) -> Ending:
    """How a process of the soak's own that registered as a worker ended: it exits 0 on
    SIGTERM, so 0 is ``exited`` and anything else needed SIGKILL (its wait status here)."""
    return Ending(pid, "registered by the soak", code == 0, code,
                  frozenset({"exited"} if code == 0 else {"killed"}), True)


def _fates(clean: bool, mode: str, watchdog_fired: bool) -> frozenset[str]:
    if clean:
        return frozenset({"exited"})
    if mode == CRASH:
        return frozenset({"gone"})
    if watchdog_fired:
        # The main process SIGKILLed its tree and itself: each one died before the drain
        # signalled it (gone), after its graceful signal (exited, of SIGKILL), or needed
        # the drain's SIGKILL all the same (killed). Its exit code tells which signal.
        return frozenset({"killed", "gone", "exited"})
    if mode == FORCE:
        return frozenset({"killed", "gone"})
    return frozenset({"killed"})


def expected_outcome(truth: Mapping[int, Ending], fates: Mapping[int, str], *,
                     force: bool) -> str:
    """The outcome the truth calls for, given the fates the summary chose where the truth
    allows two (``coordinator/drain/outcome.py``'s rules, from the other side)."""
    found = {_finding(ending, _fate(ending, fates.get(pid)), force=force)
             for pid, ending in truth.items()}
    return next((word for word in PRECEDENCE if word in found), "graceful")


def _fate(ending: Ending, said: str | None) -> str | None:
    """The fate to judge by: the summary's where the truth allows it, else the truth's own
    when it allows only one."""
    if said in ending.fates or len(ending.fates) != 1:
        return said
    return next(iter(ending.fates))


def _finding(ending: Ending, fate: str | None, *, force: bool) -> str | None:
    """What one process's ending says against a graceful outcome, if anything."""
    if fate in ("survived", "running"):
        return "survived"
    if fate == "killed":
        return "killed"
    code = ending.exit_code
    if code is None or code == 0:
        return None
    if code > 0:
        return "failed"
    if force and code == -signal.SIGKILL:
        return "killed"
    if code == -signal.SIGTERM:  # the graceful signal's default action: no cleanup ran
        return "failed" if ending.root else None
    return "signalled"


def check_summary(summary: Mapping[str, Any], truth: Mapping[int, Ending], *,
                  mode: str, clients_done: bool) -> list[str]:
    """Every way ``summary`` (a ``GET /drain`` answer) differs from ``truth``."""
    wrong: list[str] = []
    if summary.get("phase") != "done":
        wrong.append(f"phase {summary.get('phase')!r}, not done")
    listed: list[dict[str, Any]] = list(summary.get("processes") or [])
    pids = Counter(int(p["pid"]) for p in listed)
    if twice := sorted(pid for pid, n in pids.items() if n > 1):
        wrong.append(f"listed more than once: {twice}")
    if missing := sorted(set(truth) - set(pids)):
        wrong.append(f"not listed: {[(pid, truth[pid].role) for pid in missing]}")
    if strangers := sorted(set(pids) - set(truth)):
        wrong.append(f"listed but not the engine's: {strangers}")
    fates = {int(p["pid"]): str(p["fate"]) for p in listed}
    for entry in listed:
        ending = truth.get(int(entry["pid"]))
        if ending is None:
            continue
        if entry["fate"] not in ending.fates:
            wrong.append(f"{ending.role} {ending.pid}: fate {entry['fate']}, truth "
                         f"{'/'.join(sorted(ending.fates))} (exit {ending.exit_code})")
        said = entry.get("exit_code")
        if said is not None and ending.exit_code is not None and said != ending.exit_code:
            wrong.append(f"{ending.role} {ending.pid}: exit code {said}, truth "
                         f"{ending.exit_code}")
        if said is None and ending.root:
            wrong.append(f"main {ending.pid}: exit code unknown, truth {ending.exit_code}")
    counts = summary.get("counts")
    if isinstance(counts, dict):
        stated = {fate: n for fate, n in counts.items() if n}
        if stated != dict(Counter(fates.values())):
            wrong.append(f"counts {stated} against the list's {dict(Counter(fates.values()))}")
    want = expected_outcome(truth, fates, force=mode == FORCE)
    lost = int((summary.get("drain") or {}).get("lost_requests") or 0)
    if want == "graceful" and lost and clients_done and mode == NORMAL:
        wrong.append(f"{lost} lost requests claimed, yet every client stream completed and "
                     "every probe was acknowledged")
    elif want == "graceful" and lost:
        want = "lost_requests"
    if summary.get("outcome") != want:
        wrong.append(f"outcome {summary.get('outcome')!r}, truth {want!r}")
    return wrong


def untouched(engine: EngineHandle, ticks: Mapping[int, int]) -> list[str]:
    """Why the engine is not as it was before an aborted drain: a process gone or replaced,
    or a record that got a signal or started its cleanup."""
    wrong = [f"{pid} no longer runs" for pid, t in ticks.items() if start_ticks(pid) != t]
    for record in engine.records():
        if record.get("signal") is not None or record.get("cleanup") != "not started":
            wrong.append(f"{record['role']} {record['pid']}: signal {record.get('signal')}, "
                         f"cleanup {record.get('cleanup')}")
    return wrong
