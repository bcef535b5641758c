"""worker_client's public surface. That it and router_client import nothing of the service
(every module, in a fresh interpreter with the service's dependencies blocked) is
tests/test_layering.py's."""

from __future__ import annotations


def test_public_surface() -> None:
    """1. Every name in ``worker_client.__all__`` exists."""
    import worker_client

    for name in worker_client.__all__:
        assert hasattr(worker_client, name), name
