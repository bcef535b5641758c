from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import ProcessJanitor


@pytest.fixture
def janitor() -> Iterator[ProcessJanitor]:
    """Every process a test starts goes through this; all of them end with the test."""
    j = ProcessJanitor()
    try:
        yield j
    finally:
        j.close()
