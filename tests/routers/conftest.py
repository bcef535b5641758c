from __future__ import annotations

import pytest

from tests.routers.stack import ROUTERS, router_binary


@pytest.fixture(autouse=True)
def routers_installed() -> None:
    """Skip before any engine starts when the routers are not installed."""
    for name in ROUTERS:
        router_binary(name)
