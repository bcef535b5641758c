from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pods.images import Images
from tests.pods.podman import Podman, unavailable
from tests.pods.spec import unmount_leftovers
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


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """podman as this machine runs it (``tests/pods/podman.py``), for the pod tests and the
    init comparison's containers alike; skipped, with the reason, where it cannot run. What
    an earlier, killed run left is removed first, and what this run made at its end."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    runtime = Podman()
    runtime.prepare()
    runtime.remove_leftovers()
    unmount_leftovers()
    yield runtime
    runtime.remove_leftovers()


@pytest.fixture(scope="session")
def images(podman: Podman) -> Images:
    """The images the containers run, each built (or found unchanged) once per run."""
    return Images(podman)
