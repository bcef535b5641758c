"""The engine as a container's main process under ``run``, tini, ``tini -g``, dumb-init and no
init, stopped by ``podman stop -t GRACE`` (``tests.init.side_by_side``). Container step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.init.containers import unavailable
from tests.init.side_by_side import INITS, Row, run_one
from tests.pods.images import Images
from tests.pods.podman import Podman

pytestmark = pytest.mark.container

BASELINES = ("tini", "tini -g", "dumb-init", "no init")


@pytest.fixture(scope="module")
def runtime(podman: Podman, images: Images) -> tuple[Podman, Images]:
    """podman (``tests/conftest.py``) with the comparison's base made, or the reason it
    cannot run here (mmdebstrap too)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    images.base()
    return podman, images


def _clean(row: Row) -> None:
    """Exit 0, every process exited 0 after its cleanup (its own record), no zombie."""
    assert row.exit_code == 0, row
    assert {r["role"] for r in row.records} == {"main", "scheduler", "detokenizer", "daemon"}
    for record in row.records:
        assert record["exit_code"] == 0, record
        assert record["cleanup"] == "finished", record
    assert row.zombies == 0, row


@pytest.mark.parametrize("init", ["run (worker_client)", "run (--engine sglang)"])
def test_run_ends_everything_cleanly_and_keeps_a_short_stream(
        runtime: tuple[Podman, Images], tmp_path: Path, init: str) -> None:
    """1. The engine under ``run`` as the container's PID 1, a stream that ends inside the
       grace period in flight, ``podman stop``.
    2. podman records 0; every process, the daemon outside the engine's group included,
       exited 0 after its cleanup; no zombie; the stream is whole (the adopted engine's
       in-flight gauge held the drain until it ended) or handed back (a registered engine
       hands it back at once, for a router to continue)."""
    row = run_one(*runtime, init, "short", tmp_path)
    _clean(row)
    assert row.stream == ("handed back" if init == "run (worker_client)" else "whole"), row


def test_run_hands_back_a_stream_that_outlives_the_grace_period(
        runtime: tuple[Podman, Images], tmp_path: Path) -> None:
    """1. The registered engine under ``run``, a stream that would outlive any grace period.
    2. podman records 0 (no SIGKILL from it: the container's PID 1 exited 0); every process
       exited 0 after its cleanup; the stream was handed back (and acknowledged, as a router
       does)."""
    row = run_one(*runtime, "run (worker_client)", "long", tmp_path)
    _clean(row)
    assert row.stream == "handed back", row


@pytest.mark.parametrize("init", BASELINES)
def test_the_other_inits_lose_the_long_stream_and_the_daemon(
        runtime: tuple[Podman, Images], tmp_path: Path, init: str) -> None:
    """1. The same engine and the same long stream under tini, ``tini -g``, dumb-init and no
       init.
    2. The engine serves its stream on, so the runtime's SIGKILL at the end of the grace
       period ends the container: podman records 137 and the stream is cut; the daemon,
       outside the engine's process group, was never signalled and was killed with the
       container. No init leaves the short-lived orphan a zombie."""
    assert init in INITS
    row = run_one(*runtime, init, "long", tmp_path)
    assert row.exit_code == 137, row
    assert row.stream == "cut", row
    assert row.fates["daemon"] == ["killed, never signalled"], row
    assert row.zombies == (1 if init == "no init" else 0), row
