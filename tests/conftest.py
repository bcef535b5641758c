from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import LeftBehind, ProcessJanitor


@pytest.fixture
def janitor() -> Iterator[ProcessJanitor]:
    """Every process a test starts goes through this; all of them end with the test, and
    the test fails (in its teardown) when the janitor had to end one, a service did not stop
    cleanly on SIGTERM, or a runtime file was left (``tests/support/processes.py``)."""
    j = ProcessJanitor()
    try:
        yield j
    finally:
        j.close()
    problems, j.problems = j.problems, []
    if problems:
        pytest.fail(str(LeftBehind(problems)), pytrace=False)
