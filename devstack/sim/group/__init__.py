"""A simulated multi-node engine: one engine whose ranks span several pods.

Shaped like SGLang's ``--nnodes/--node-rank/--dist-init-addr`` (and vLLM's multi-node
launch): the leader pod runs the HTTP front end (``devstack.sim``'s main process) and rank 0;
each follower pod runs its own ranks under a main process with no HTTP. The ranks are joined
by sockets that behave like a collective: every token is one step that rank 0 broadcasts to
every rank and that completes only when all of them took part; a rank gone or silent makes
the others hang and then abort, as NCCL's watchdog does. Each rank records how it ended.
docs/multinode-sim.md tells the whole story.

    protocol    the collective's wire, and the causes a rank's record names
    collective  rank 0's side and every other rank's, with the hang-then-abort
    rank        ``python -m devstack.sim.group.rank``: one rank process
    stepper     the leader's front end asking rank 0 for steps
    leader      the leader pod's main process (``EngineMain`` over the group)
    pod         which pod runs what; a follower pod's main process
    network     a network namespace per pod, or a loopback address per pod
    launcher    ``start_group``, ``launch_pod``, ``spawn_beside`` (a sidecar) and handles

The names below are imported when first used: every rank process imports this package
first (``python -m devstack.sim.group.rank``), and needs none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devstack.sim.group.launcher import (
        GroupHandle,
        GroupShape,
        Pod,
        launch_pod,
        lws_environment,
        spawn_beside,
        start_group,
    )
    from devstack.sim.group.network import GroupNetwork, PodPlace, make_network

_WHERE = {
    "GroupHandle": "devstack.sim.group.launcher",
    "GroupNetwork": "devstack.sim.group.network",
    "GroupShape": "devstack.sim.group.launcher",
    "Pod": "devstack.sim.group.launcher",
    "PodPlace": "devstack.sim.group.network",
    "launch_pod": "devstack.sim.group.launcher",
    "lws_environment": "devstack.sim.group.launcher",
    "make_network": "devstack.sim.group.network",
    "spawn_beside": "devstack.sim.group.launcher",
    "start_group": "devstack.sim.group.launcher",
}

__all__ = ["GroupHandle", "GroupNetwork", "GroupShape", "Pod", "PodPlace", "launch_pod",
           "lws_environment", "make_network", "spawn_beside", "start_group"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
