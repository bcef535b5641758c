"""Exceptions of the simulated engine.

    CoordinatorError
    └── SimError
        ├── SimStartupError   the engine or one of its children did not come up in time
        └── SimArgumentError  a knob value makes no sense
"""

from __future__ import annotations

from coordinator.errors import CoordinatorError


class SimError(CoordinatorError):
    """Base class of every error the simulated engine raises on purpose."""


class SimStartupError(SimError):
    """A process of the simulated engine did not come up."""


class SimArgumentError(SimError):
    """A knob value makes no sense."""
