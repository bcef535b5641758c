"""Atomic persistence of the drain, so a coordinator killed mid-drain resumes where it was.

The file is one JSON document (``version``, ``phase``, ``generation``, ``timeline``, ``drain``,
``workers``, ``migrations``, ``outcomes``, ``summary``), replaced atomically: written to a
temporary file in the same directory, fsynced, renamed over the old one, and the directory
fsynced. A reader therefore sees the old document or the new one, never a torn one.

Writes are coalesced: ``StateWriter.mark_dirty()`` (cheap, called on every change) schedules one
write of the latest snapshot; ``flush()`` writes at once (before the kill starts, so a restart
knows the drain had reached ``terminating``). Outcomes reported by the kill engine are therefore
on disk within one write of their change; a restart inside that window can at worst re-signal
a process the engine had just signalled with the same graceful signal, and a process that
ended inside it is missing from the resumed drain's summary (nothing can find it afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_VERSION = 1

log = logging.getLogger(__name__)


def write_atomic(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` (JSON) atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(document, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_state(path: Path) -> dict[str, Any] | None:
    """The persisted document, or None when there is none or it is unusable (logged)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        log.warning("state file %s is not JSON; starting fresh", path)
        return None
    if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
        log.warning("state file %s has an unknown version; starting fresh", path)
        return None
    return document


class StateWriter:
    """Coalesces many changes into few atomic writes of the latest snapshot."""

    def __init__(self, path: Path | None, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._snapshot = snapshot
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.writes = 0

    def mark_dirty(self) -> None:
        """Note a change; one write of the latest state follows soon (off the event loop)."""
        if self.path is None:
            return
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write_soon())

    async def flush(self) -> None:
        """Write the current state now and wait until it is on disk."""
        if self.path is None:
            return
        self._dirty = True
        await self._write_if_dirty()

    async def close(self) -> None:
        """Write what is pending and stop."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self._write_if_dirty()

    async def _write_soon(self) -> None:
        # Let the change that marked us dirty finish (and its siblings join) before writing.
        await asyncio.sleep(0)
        # Changes made while a write is on its way find this task still running and start
        # no other: write again until nothing is left, or they would wait for the next change.
        while self._dirty:
            await self._write_if_dirty()

    async def _write_if_dirty(self) -> None:
        async with self._lock:
            if not self._dirty or self.path is None:
                return
            self._dirty = False
            document = {"version": STATE_VERSION, **self._snapshot()}
            try:
                await asyncio.to_thread(write_atomic, self.path, document)
                self.writes += 1
            except OSError:
                log.exception("could not write state file %s", self.path)
