"""A simulated multi-process inference engine, shaped like SGLang, for tests, demo and bench.

``python -m devstack.sim`` starts a main process (streaming completions over HTTP, a child
watchdog), scheduler children with ``PR_SET_PDEATHSIG(SIGKILL)``, a detokenizer, and with
``--dp N`` a data-parallel controller whose schedulers are its own children. Every process
records how it ended. ``start_engine`` starts one and waits until it is up;
``expected_tokens`` says what it will stream for a prompt.

The names below are imported when first used: every child process of the engine imports
this package first (``python -m devstack.sim.<role>``), and needs none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devstack.sim.knobs import EngineKnobs
    from devstack.sim.launcher import EngineHandle, SimProcess, start_engine
    from devstack.sim.roles import Role
    from devstack.sim.tokens import expected_tokens

_WHERE = {
    "EngineHandle": "devstack.sim.launcher",
    "EngineKnobs": "devstack.sim.knobs",
    "Role": "devstack.sim.roles",
    "SimProcess": "devstack.sim.launcher",
    "expected_tokens": "devstack.sim.tokens",
    "start_engine": "devstack.sim.launcher",
}

__all__ = ["EngineHandle", "EngineKnobs", "Role", "SimProcess", "expected_tokens", "start_engine"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
