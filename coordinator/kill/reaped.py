"""How each process this process reaped itself ended: the book every exit-code reader asks.

A process learns a child's exit status from ``wait``, once. Where the coordinator is the
engine's init (``shutdown-coordinator run``: PID 1 of a container, or a subreaper), it reaps
every child itself, the engine's main process and every orphan reparented to it, and the
kill engine and the worker registry read the same exits' codes through their pidfds. After
the reap, ``waitid(P_PIDFD, WNOWAIT)`` answers ``ECHILD`` and ``/proc/<pid>`` is gone;
``PIDFD_GET_INFO`` keeps the code on Linux 6.15 and later only. So the reaper writes each
status here, keyed by PID *and* start ticks (the PID is free for reuse the moment it is
reaped), before anything else can run, and ``pidfd.exit_code`` and
``process_exit.exit_code`` look here first.

The reaper and the readers run on one event loop: a reap and its record are one step, so no
reader can see the reaped process without its record. The book is bounded
(``KEPT``, oldest forgotten first): its readers ask within moments of an exit.
"""

from __future__ import annotations

from collections import OrderedDict

KEPT = 65_536
"""Records kept at most: far more processes than a pod forks during a kill, and a few MB."""

_codes: OrderedDict[tuple[int, int], int] = OrderedDict()


def record(pid: int, start_ticks: int, exit_code: int) -> None:
    """Keep how the process ``pid`` started at ``start_ticks`` ended (``subprocess``
    convention: ``>= 0`` its exit status, ``< 0`` the signal that killed it)."""
    key = (pid, start_ticks)
    _codes[key] = exit_code
    _codes.move_to_end(key)
    while len(_codes) > KEPT:
        _codes.popitem(last=False)


def lookup(pid: int, start_ticks: int) -> int | None:
    """The exit code this process reaped for ``pid`` started at ``start_ticks``, or None
    (never reaped here, or forgotten)."""
    return _codes.get((pid, start_ticks))


def forget_all() -> None:
    """Empty the book (tests)."""
    _codes.clear()
