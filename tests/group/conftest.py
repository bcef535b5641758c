from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.sim.group.launcher import GroupHandle
from tests.support.processes import ProcessJanitor


@pytest.fixture
def sim_groups(janitor: ProcessJanitor, tmp_path: Path) -> Iterator[list[GroupHandle]]:
    """Groups started by the test; each still running at the end is SIGKILLed and reaped
    (the janitor then checks that nothing is left)."""
    groups: list[GroupHandle] = []
    yield groups
    for group in groups:
        try:
            group.kill()
        finally:
            group.close()
