"""The group's decision core: a follower's states and the one transition table. Pure: no
clock, no I/O; the follower's link (``follower.py``) feeds it events and acts on the state.

    joining ──announced──► joined ──leader draining / own drain──► draining
       │                                                             │   ▲
       └─────────── leader draining / own drain ─────────────────────┘   │ aborted ─► joined
    draining ──leader engine stopped / its share of the budget over──► released
    draining ──leader unreachable past the bound──► local
    released, local ──summary delivered──► reported
    released, local, reported ──new cycle──► joining

A follower's own kill waits while it is ``joining``, ``joined`` or ``draining``
(``KILL_MAY_RUN`` says when it may run). An event a state does not list changes nothing: a
leader lost while serving is no drain, an engine stop reported twice is one.
"""

from __future__ import annotations

import enum


class FollowerState(enum.StrEnum):
    """Where a follower stands in its group's drain."""

    JOINING = "joining"
    """Announcing itself to the leader (retried); the pod serves."""
    JOINED = "joined"
    """The leader lists it; the pod serves and follows the leader's phase."""
    DRAINING = "draining"
    """The group drains; this pod's kill waits for the leader's engine to stop."""
    RELEASED = "released"
    """The leader's engine stopped (or its share of the budget is over): the kill may run."""
    LOCAL = "local"
    """The leader could not be reached for the bound: this pod drains on its own."""
    REPORTED = "reported"
    """This pod's summary reached the leader."""


class FollowerEvent(enum.StrEnum):
    """What the follower's link observed."""

    ANNOUNCED = "announced"
    LEADER_DRAINING = "leader draining"
    DRAIN_STARTED = "own drain started"
    LEADER_ENGINE_STOPPED = "leader engine stopped"
    GATE_EXPIRED = "leader's budget share over"
    LEADER_LOST = "leader unreachable"
    ABORTED = "leader aborted"
    REPORTED = "summary delivered"
    NEW_CYCLE = "new cycle"


_S, _E = FollowerState, FollowerEvent

TRANSITIONS: dict[FollowerState, dict[FollowerEvent, FollowerState]] = {
    _S.JOINING: {_E.ANNOUNCED: _S.JOINED, _E.LEADER_DRAINING: _S.DRAINING,
                 _E.DRAIN_STARTED: _S.DRAINING},
    _S.JOINED: {_E.LEADER_DRAINING: _S.DRAINING, _E.DRAIN_STARTED: _S.DRAINING},
    _S.DRAINING: {_E.LEADER_ENGINE_STOPPED: _S.RELEASED, _E.GATE_EXPIRED: _S.RELEASED,
                  _E.LEADER_LOST: _S.LOCAL, _E.ABORTED: _S.JOINED},
    _S.RELEASED: {_E.REPORTED: _S.REPORTED, _E.NEW_CYCLE: _S.JOINING},
    _S.LOCAL: {_E.REPORTED: _S.REPORTED, _E.NEW_CYCLE: _S.JOINING},
    _S.REPORTED: {_E.NEW_CYCLE: _S.JOINING},
}
"""The only moves; anything else leaves the state as it is."""

KILL_MAY_RUN = frozenset({_S.RELEASED, _S.LOCAL, _S.REPORTED})
"""States in which the follower's own kill may run."""

DRAINING_STATES = frozenset({_S.DRAINING, _S.RELEASED, _S.LOCAL, _S.REPORTED})
"""States of a follower whose group drain has started."""


def step(state: FollowerState, event: FollowerEvent) -> FollowerState | None:
    """The state after ``event``; None when the table has no move for it (nothing
    changes)."""
    return TRANSITIONS[state].get(event)


def leader_lost(unreachable_since: float | None, now: float, bound_s: float) -> bool:
    """The leader counts as lost once it has been unreachable for ``bound_s`` seconds."""
    return unreachable_since is not None and now - unreachable_since >= bound_s
