from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.local_stack import LocalStack
from tests.routers.stack import ROUTERS, router_binary
from tests.support.processes import ProcessJanitor


@pytest.fixture(autouse=True)
def routers_installed() -> None:
    """Skip before any engine starts when the routers are not installed."""
    for name in ROUTERS:
        router_binary(name)


@pytest.fixture
def local_stack(janitor: ProcessJanitor, tmp_path: Path) -> Iterator[LocalStack]:
    """A ``LocalStack`` whose every process the janitor starts (its SIGKILL fallback covers
    them): ``close()`` ends them in order at the test's end (router and engines, then the
    coordinators), before the janitor checks that nothing is left."""
    stack = LocalStack(tmp_path, popen=janitor.spawn)
    yield stack
    asyncio.run(stack.close())
