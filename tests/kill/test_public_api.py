"""The public surface of coordinator.kill."""

from __future__ import annotations

import coordinator.kill as kill


def test_all_names_the_public_surface() -> None:
    assert sorted(kill.__all__) == [
        "Fate", "KillPolicy", "KillReport", "OnUpdate", "PriorOutcomes", "ProcessOutcome",
        "Target", "Terminator", "TierSpec", "terminate",
    ]
    for name in kill.__all__:
        assert getattr(kill, name) is not None
