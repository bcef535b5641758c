"""The state file: atomic replacement, coalesced writes, unusable files ignored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coordinator.drain.state_file import STATE_VERSION, StateWriter, read_state, write_atomic


def test_write_replaces_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, {"version": STATE_VERSION, "phase": "draining"})
    write_atomic(path, {"version": STATE_VERSION, "phase": "migrating"})
    assert read_state(path) == {"version": STATE_VERSION, "phase": "migrating"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_unusable_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert read_state(path) is None
    path.write_text("{torn")
    assert read_state(path) is None
    path.write_text(json.dumps({"version": 999}))
    assert read_state(path) is None


async def test_many_changes_coalesce_into_few_writes(tmp_path: Path) -> None:
    """1. mark dirty 100 times in one loop iteration; 2. flush; 3. the file holds the last
    state and far fewer than 100 writes happened."""
    path = tmp_path / "state.json"
    state: dict[str, Any] = {"n": 0}
    writer = StateWriter(path, lambda: dict(state))
    for n in range(100):
        state["n"] = n
        writer.mark_dirty()
    await writer.flush()
    await writer.close()
    assert read_state(path) == {"version": STATE_VERSION, "n": 99}
    assert writer.writes <= 2


async def test_no_path_means_no_file(tmp_path: Path) -> None:
    writer = StateWriter(None, dict)
    writer.mark_dirty()
    await writer.flush()
    assert writer.writes == 0
