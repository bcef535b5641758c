"""Fixtures of the pod tests: the kernel's exit records, the engines' tiny model, and pods
that are removed whatever the test did (podman and the images: ``tests/conftest.py``, shared
with the init comparison's containers).

Every test module here is marked ``container`` (``pytestmark``): the core suite leaves them
out, scripts/test.sh runs them in its container step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.engines.tiny_model import write_tiny_model
from tests.pods import exits
from tests.pods.kubelet import Pod
from tests.pods.network import ClusterNetwork
from tests.pods.podman import Podman
from tests.pods.spec import Objects
from tests.support.processes import ProcessJanitor


@pytest.fixture
def process_exits() -> Iterator[exits.ProcessExits]:
    reason = exits.unavailable()
    if reason is not None:
        pytest.skip(reason)
    with exits.ProcessExits() as listener:
        yield listener


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, readable by the engines' user in the pod."""
    directory = write_tiny_model(tmp_path_factory.mktemp("pod-model"))
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)
    return directory


PodFactory = Callable[..., Pod]


def shared_directory(path: Path) -> Path:
    """A new directory any user may write, for a ``hostPath`` the pod's users share with
    the test (records, discovery)."""
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


@pytest.fixture
def cluster_network() -> Iterator[ClusterNetwork]:
    """A pod network of its own (``network.ClusterNetwork``), removed at the test's end."""
    with ClusterNetwork() as network:
        yield network


@pytest.fixture
def pods(podman: Podman, janitor: ProcessJanitor, tmp_path: Path) -> Iterator[PodFactory]:
    """``pods(template, objects, name=...)``: a ``Pod`` (not started) that is removed at the
    end of the test, with everything the node ran for it."""
    made: list[Pod] = []

    def make(template: Mapping[str, Any], objects: Objects | None = None, *, name: str = "pod",
             extra_ports: Sequence[int] = (), network: ClusterNetwork | None = None) -> Pod:
        pod = Pod(podman, template, objects or Objects(), name=name,
                  workdir=tmp_path / f"pod-{len(made)}", spawn=janitor.spawn,
                  extra_ports=extra_ports, network=network)
        made.append(pod)
        return pod

    try:
        yield make
    finally:
        for pod in reversed(made):
            pod.close()
