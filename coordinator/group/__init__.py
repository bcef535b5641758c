"""A group drain: engines whose ranks span several pods (a LeaderWorkerSet's leader and
followers) drain as one, the leader's coordinator owning the group's drain (docs/group.md).

    membership  which group a coordinator is in, from the LWS environment or the settings
    table       the follower's states and the one transition table (pure)
    budget      the group's one budget: the leader's drain, the followers' kills (pure)
    summary     one summary for the group, merged from every pod's (pure)
    peer        a follower's calls to its leader (httpx, tenacity); the error tree
    leader      the leader's book: members, their reports, ``GET /group``
    follower    a follower's link: follow the leader, hold the kill, report
    ports       the group wired into the drain controller's ``Fleet`` and ``Killer``
    node        one coordinator's part in its group

Imports ``drain/`` and ``kill/``, never ``service/`` (which wires it to HTTP).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.group.membership import GroupSettingError, Membership
    from coordinator.group.node import ControllerHost, GroupNode

_WHERE = {
    "ControllerHost": "coordinator.group.node",
    "GroupNode": "coordinator.group.node",
    "GroupSettingError": "coordinator.group.membership",
    "Membership": "coordinator.group.membership",
}
"""Imported when first used: the settings read ``coordinator.group.membership`` alone, and the
command line's ``drain`` (a preStop hook's path) must not load httpx through the node. (The
function ``membership.membership`` is not re-exported: it shares its module's name.)"""

__all__ = ["ControllerHost", "GroupNode", "GroupSettingError", "Membership"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
