"""Exceptions of the simulated engine.

    SimError
    ├── SimStartupError   the engine or one of its children did not come up in time
    └── SimArgumentError  a knob value makes no sense

The simulated engine is not part of the coordinator, so its errors have a base of their own
(and none of its processes imports ``coordinator``).
"""

from __future__ import annotations


class SimError(Exception):
    """Base class of every error the simulated engine raises on purpose."""


class SimStartupError(SimError):
    """A process of the simulated engine did not come up."""


class SimArgumentError(SimError):
    """A knob value makes no sense."""
