"""The one scale from time to position, and the ticks of its axis.

Every mark is placed by ``Scale.x``::

    x(t) = x0 + (t - t0) * width / (t1 - t0)

``t`` in epoch seconds, ``x`` in SVG user units (one unit is one CSS pixel: the SVG's
``width`` and ``height`` equal its ``viewBox``). The drawing carries the four numbers as
``data-t0``, ``data-t1``, ``data-x0`` and ``data-width`` on its root ``<svg>``, and each mark
its recorded time as ``data-t``, so a reader (a test, a script) can recompute where a mark
must be and compare it with where it was drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0,
         15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Tick spacings in seconds, from 1 ms to an hour."""
MIN_SPAN_S = 0.001
"""A window narrower than this is widened to it (a drain whose every event has one time)."""
PAD = 0.02
"""Share of the span added on each side, so marks at the ends are not cut."""


@dataclass(frozen=True)
class Scale:
    """Maps epoch seconds ``[t0, t1]`` onto ``[x0, x0 + width]``."""

    t0: float
    t1: float
    x0: float
    width: float

    @classmethod
    def around(cls, first: float, last: float, x0: float, width: float) -> Scale:
        """The scale of a window holding ``first`` to ``last``, padded on both sides."""
        if last < first:
            first, last = last, first
        span = max(last - first, MIN_SPAN_S)
        return cls(first - span * PAD, first + span * (1 + PAD), x0, width)

    def x(self, t: float) -> float:
        """Where time ``t`` is drawn (clamped to the plot, for times outside the window)."""
        position = self.x0 + (t - self.t0) * self.width / (self.t1 - self.t0)
        return min(max(position, self.x0), self.x0 + self.width)

    def ticks(self, origin: float, most: int = 10) -> list[tuple[float, float]]:
        """(time, seconds from ``origin``) of the axis ticks: a round step, at most ``most``
        ticks, aligned on ``origin`` (the drain's start is ``+0``)."""
        span = self.t1 - self.t0
        step = next((s for s in STEPS if span / s <= most), math.ceil(span / most))
        first = math.ceil((self.t0 - origin) / step)
        last = math.floor((self.t1 - origin) / step)
        return [(origin + k * step, k * step) for k in range(first, last + 1)]
