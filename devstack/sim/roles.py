"""The processes of the simulated engine, their exit codes, and how knobs name them."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """What a process of the simulated engine is; also the prefix of its end-record file."""

    MAIN = "main"
    """The tokenizer/HTTP process: serves completions, owns the children and the watchdog."""
    SCHEDULER = "scheduler"
    """One per tensor-parallel rank; a child of the main process or of the DP controller."""
    DETOKENIZER = "detokenizer"
    DP_CONTROLLER = "dp_controller"
    """Data-parallel controller; its schedulers are its own children."""
    HELPER = "helper"
    """A process a child starts during its shutdown (``--fork-on-shutdown``)."""
    DAEMON = "daemon"
    """A process a child daemonizes when it comes up (``--daemonize``): out of its tree."""


EXIT_OK = 0
EXIT_STARTUP_FAILED = 2
"""The main process could not bring its children up in time."""
EXIT_PARENT_GONE = 3
"""A child found its parent already gone right after arming PDEATHSIG."""
EXIT_USAGE = 64


def knob_matches(specs: tuple[str, ...] | list[str], role: Role, rank: int | None = None) -> bool:
    """Whether a knob value names this process.

    A spec is a role (``scheduler`` — every scheduler) or a role and a rank
    (``scheduler:1`` — only rank 1).
    """
    for spec in specs:
        name, _, rank_text = spec.partition(":")
        if name != role.value:
            continue
        if not rank_text or (rank is not None and rank_text == str(rank)):
            return True
    return False
