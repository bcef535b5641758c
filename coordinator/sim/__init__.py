"""A simulated multi-process inference engine, shaped like SGLang, for tests, demo and bench.

``python -m coordinator.sim`` starts a main process (streaming completions over HTTP, a child
watchdog), scheduler children with ``PR_SET_PDEATHSIG(SIGKILL)``, a detokenizer, and with
``--dp N`` a data-parallel controller whose schedulers are its own children. Every process
records how it ended. ``start_engine`` starts one and waits until it is up;
``expected_tokens`` says what it will stream for a prompt.

The names below are imported when first used: every child process of the engine imports
this package first (``python -m coordinator.sim.<role>``), and needs none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.sim.knobs import EngineKnobs
    from coordinator.sim.launcher import EngineHandle, SimProcess, start_engine
    from coordinator.sim.roles import Role
    from coordinator.sim.tokens import expected_tokens

_WHERE = {
    "EngineHandle": "coordinator.sim.launcher",
    "EngineKnobs": "coordinator.sim.knobs",
    "Role": "coordinator.sim.roles",
    "SimProcess": "coordinator.sim.launcher",
    "expected_tokens": "coordinator.sim.tokens",
    "start_engine": "coordinator.sim.launcher",
}

__all__ = ["EngineHandle", "EngineKnobs", "Role", "SimProcess", "expected_tokens", "start_engine"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
