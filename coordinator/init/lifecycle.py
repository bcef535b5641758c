"""The engine's init, as states and one table of moves; its exit code; its signals. Pure.

    RUNNING ──stop signal / drain by the API──▶ DRAINING ──aborted by the API──▶ RUNNING
       │                                          │
       └──── the main process exited ───────▶ ENDING ◀── the drain is done
                                                  │ what is left ended, every child reaped
                                                  ▼
                                                DONE

RUNNING: the engine serves; signals other than the stop signal go to its main process;
every orphan is reaped as it exits. DRAINING: the drain a preStop hook would run, started by
the runtime's stop signal (or an operator's ``POST /drain``). ENDING: the main process has
exited and no drain runs: whatever of ours is still alive gets the ordered kill, and every
child is reaped. DONE: the exit code is the main process's own status.
"""

from __future__ import annotations

import enum
import signal

from coordinator.errors import CoordinatorError


class State(enum.Enum):
    RUNNING = "running"
    """The engine runs; no drain."""
    DRAINING = "draining"
    """A drain runs (the stop signal's, or one an operator started)."""
    ENDING = "ending"
    """The main process has exited; what is left is being ended and reaped."""
    DONE = "done"
    """Nothing of ours is left; the exit code is known."""


class Move(enum.Enum):
    DRAIN = "drain"
    ABORTED = "aborted"
    MAIN_EXITED = "main exited"
    DRAIN_DONE = "drain done"
    ALL_REAPED = "all reaped"


MOVES: dict[tuple[State, Move], State] = {
    (State.RUNNING, Move.DRAIN): State.DRAINING,
    (State.DRAINING, Move.ABORTED): State.RUNNING,
    (State.RUNNING, Move.MAIN_EXITED): State.ENDING,
    (State.DRAINING, Move.DRAIN_DONE): State.ENDING,
    (State.ENDING, Move.ALL_REAPED): State.DONE,
}
"""Every allowed move; anything else is a bug (``IllegalMove``)."""


class IllegalMove(CoordinatorError):
    """A move the table does not allow from the current state."""


def after(state: State, move: Move) -> State:
    """The state ``move`` leads to from ``state``."""
    try:
        return MOVES[(state, move)]
    except KeyError:
        raise IllegalMove(f"the engine's init cannot {move.value!r} while "
                          f"{state.value}") from None


FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGTERM, signal.SIGALRM, signal.SIGWINCH, signal.SIGCONT,
             signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR, signal.SIGURG)
"""Signals passed on to the engine's main process alone (the stop signal excepted), as tini
passes them: never a process group. Job control (SIGTSTP, SIGTTIN, SIGTTOU) and the
synchronous signals (SIGSEGV, SIGFPE, …) are this process's own."""


def forwarded(stop_signal: int) -> tuple[int, ...]:
    """The signals forwarded when ``stop_signal`` starts the drain."""
    return tuple(s for s in FORWARDED if s != stop_signal)


def parse_signal(text: str) -> int:
    """``SIGTERM``, ``TERM`` or ``15`` as a signal number (``ValueError`` otherwise). Only a
    signal this process can catch and that is not its own (``SIGCHLD``) may stop it."""
    name = text.strip().upper()
    try:
        sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
            name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a signal") from None
    if sig not in FORWARDED:
        raise ValueError(f"{sig.name} cannot be the stop signal (one of "
                         f"{', '.join(s.name for s in FORWARDED)})")
    return int(sig)


def exit_status(code: int) -> int:
    """A process's exit code (``subprocess`` convention) as this process's exit status: its
    own status, or 128 + the signal that killed it, as shells and tini report it."""
    return 128 + -code if code < 0 else code


def describe(code: int | None) -> str:
    """``exited 0``, ``killed by SIGKILL``, or ``unknown``."""
    if code is None:
        return "unknown"
    if code >= 0:
        return f"exited {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"
