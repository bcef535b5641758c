"""Atomic persistence of the drain, so a coordinator killed mid-drain resumes where it was.

The file is one JSON document (``version``, ``phase``, ``generation``, ``timeline``, ``drain``,
``last``, ``workers``, ``migrations``), replaced atomically: written to a temporary file in
the same directory (``coordinator.files``: no planted link is followed), fsynced, renamed over
the old one, and the directory fsynced. A reader therefore sees the old document or the new
one, never a torn one. It is never larger than the reader accepts: what a resumed drain can
do without is left out first, and said (``state_bounds``; ``dropped`` in the document and in
``/status``).

Reading (``load_state``) never fails and never hands back part of a document: a file that is
not a regular file, not UTF-8, not JSON, or not a whole valid document
(``coordinator.drain.state_schema``) is moved aside to ``<path>.corrupt-<UTC time>`` and the
coordinator starts fresh; a missing file is a fresh start.

Writes are coalesced: ``StateWriter.mark_dirty()`` (cheap, called on every change) schedules one
write of the latest snapshot; ``flush()`` writes at once (before the kill starts, so a restart
knows the drain had reached ``terminating``). Outcomes reported by the kill engine are therefore
on disk within one write of their change; a restart inside that window can at worst re-signal
a process the engine had just signalled with the same graceful signal, and a process that
ended inside it is missing from the resumed drain's summary (nothing can find it afterwards).

A write that fails (disk full, read-only, the path taken by a directory) never raises into
the drain: it is counted, logged (the first of a run of failures, and each new error), and
retried after a pause that doubles from ``RETRY_FIRST_S`` to ``RETRY_MAX_S``; while failing,
changes wait for that retry instead of each trying again, and ``flush()`` always tries.
``flush()`` waits at most ``flush_timeout_s`` for the disk; a write still pending then goes
on in the background, and the drain goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinator.drain.state_bounds import MAX_STATE_BYTES, fit
from coordinator.drain.state_schema import STATE_VERSION, StateFileError, validate
from coordinator.files import replace_file

__all__ = ["MAX_STATE_BYTES", "STATE_VERSION", "Loaded", "StateFileError", "StateWriter",
           "load_state", "parse_state", "set_aside", "write_atomic"]

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
FLUSH_TIMEOUT_S = 2.0
"""Longest a ``flush()`` waits for the disk (a hung one must not hold the drain)."""

log = logging.getLogger(__name__)


def write_atomic(path: Path, document: dict[str, Any]) -> dict[str, int]:
    """Replace ``path`` with ``document`` (JSON) atomically and durably, readable by its
    owner alone (``coordinator.files``), never larger than the reader accepts
    (``state_bounds.fit``); returns what was dropped to make it fit (empty: nothing).
    ``StateTooLarge`` (the file is left as it was) when it cannot fit."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data, dropped = fit(document)
    replace_file(path, data, mode=0o600, durable=True)
    return dropped


def parse_state(data: bytes, now: float | None = None) -> dict[str, Any]:
    """Decode, parse and validate a whole document (``StateFileError`` saying why not)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(f"not UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"not JSON ({exc})") from None
    except RecursionError:
        raise StateFileError("not JSON (nested too deeply)") from None
    validate(document, now)
    result: dict[str, Any] = document
    return result


def _read(path: Path) -> bytes:
    """The file's bytes: ``FileNotFoundError`` when absent, ``StateFileError`` when it is
    not a regular file or too large, ``OSError`` when it cannot be read."""
    # O_NONBLOCK: a named pipe at the path must not hang the start-up.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise StateFileError("a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise StateFileError("not a regular file")
        data = handle.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise StateFileError(f"larger than {MAX_STATE_BYTES} bytes")
    return data


@dataclass(frozen=True)
class Loaded:
    """What ``load_state`` found."""

    document: dict[str, Any] | None
    """The whole, valid document; None for a fresh start."""
    problem: str | None = None
    """Why the file was not used (None when it was, or there was none)."""
    moved_to: Path | None = None
    """Where the unusable file was set aside (None when it could not be moved)."""


def load_state(path: Path, now: float | None = None) -> Loaded:
    """Read and validate the state file; an unusable one is set aside. Never raises."""
    try:
        return Loaded(parse_state(_read(path), time.time() if now is None else now))
    except FileNotFoundError:
        return Loaded(None)
    except StateFileError as exc:
        problem = str(exc)
    except IsADirectoryError:
        problem = "a directory, not a file"
    except OSError as exc:
        problem = f"unreadable ({exc.strerror or exc})"
    return Loaded(None, problem, set_aside(path, problem))


def set_aside(path: Path, problem: str) -> Path | None:
    """Move an unusable state file (or whatever holds its path) to
    ``<path>.corrupt-<UTC time>``; None (logged) when it cannot be moved."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for n in range(2, 100):
        if not os.path.lexists(target):
            break
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        os.rename(path, target)
    except OSError as exc:
        log.warning("state file %s is unusable (%s) and could not be moved aside (%s); "
                    "starting fresh", path, problem, exc.strerror or exc)
        return None
    log.warning("state file %s is unusable (%s); moved it to %s and starting fresh",
                path, problem, target)
    return target


class StateWriter:
    """Coalesces many changes into few atomic writes of the latest snapshot, and keeps the
    record of how the writes went (``status()``)."""

    def __init__(
        self,
        path: Path | None,
        snapshot: Callable[[], dict[str, Any]],
        *,
        on_result: Callable[[bool], None] | None = None,
        write: Callable[[Path, dict[str, Any]], dict[str, int] | None] = write_atomic,
        flush_timeout_s: float = FLUSH_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._on_result = on_result
        """Called after every write attempt (True: it reached the disk)."""
        self._write = write
        self.flush_timeout_s = flush_timeout_s
        self._clock = clock
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._retry: asyncio.TimerHandle | None = None
        self._retry_task: asyncio.Task[None] | None = None
        self._retry_s = RETRY_FIRST_S
        self._closed = False
        self._background: set[asyncio.Future[bool]] = set()
        self.writes = 0
        self.failures = 0
        self.failing = False
        """The last write attempt failed."""
        self.last_write_at: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.dropped: dict[str, int] = {}
        """What the last write left out to fit what the reader accepts (``state_bounds``)."""

    def status(self) -> dict[str, Any]:
        """How the writes went, for ``/status``."""
        return {"path": str(self.path) if self.path is not None else None,
                "ok": not self.failing, "writes": self.writes, "failures": self.failures,
                "last_write_at": self.last_write_at, "last_error": self.last_error,
                "last_error_at": self.last_error_at, "dropped": dict(self.dropped)}

    def mark_dirty(self) -> None:
        """Note a change; one write of the latest state follows soon (off the event loop)."""
        if self.path is None:
            return
        self._dirty = True
        if self.failing:
            return  # the retry timer writes the latest state
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write_soon())

    async def flush(self) -> None:
        """Write the current state now and wait (at most ``flush_timeout_s``) until it is on
        disk. Never raises for the disk: a failure is counted, logged and retried."""
        if self.path is None:
            return
        self._dirty = True
        await self._bounded(self._write_if_dirty())

    async def close(self) -> None:
        """Write what is pending (waiting a bounded time) and stop retrying."""
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.path is None:
            return

        async def finish() -> bool:
            running = [t for t in (self._task, self._retry_task) if t is not None]
            await asyncio.gather(*running, return_exceptions=True)
            return await self._write_if_dirty()

        await self._bounded(finish())

    async def _bounded(self, write: Coroutine[Any, Any, bool]) -> None:
        future: asyncio.Future[bool] = asyncio.ensure_future(write)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.flush_timeout_s)
        except TimeoutError:
            log.warning("state file %s: a write is still pending after %.1fs; going on",
                        self.path, self.flush_timeout_s)

    async def _write_soon(self) -> None:
        # Let the change that marked us dirty finish (and its siblings join) before writing.
        await asyncio.sleep(0)
        # Changes made while a write is on its way find this task still running and start
        # no other: write again until nothing is left, or they would wait for the next change.
        while self._dirty and not self.failing:
            await self._write_if_dirty()

    async def _write_if_dirty(self) -> bool:
        """Write the latest snapshot if anything changed; False when the write failed."""
        async with self._lock:
            if not self._dirty or self.path is None:
                return True
            self._dirty = False
            try:
                document = {"version": STATE_VERSION, **self._snapshot()}
                dropped = await asyncio.to_thread(self._write, self.path, document) or {}
            except asyncio.CancelledError:
                self._dirty = True
                raise
            except Exception as exc:  # never into the drain: counted, shown, retried
                self._dirty = True
                self._failed(exc)
                return False
            self._succeeded(dropped)
            return True

    def _succeeded(self, dropped: dict[str, int]) -> None:
        if dropped.keys() != self.dropped.keys():
            if dropped:
                log.warning("state file %s: the document was larger than its reader accepts; "
                            "left out to fit: %s", self.path,
                            ", ".join(f"{k} {v}" for k, v in dropped.items()))
            else:
                log.info("state file %s: written whole again", self.path)
        self.dropped = dropped
        recovered = self.failing
        self.writes += 1
        self.last_write_at = self._clock()
        self.failing = False
        self._retry_s = RETRY_FIRST_S
        if recovered:
            log.warning("state file %s: writing again after %d failed attempt(s)", self.path,
                        self.failures)
        self._tell(True)

    def _failed(self, exc: Exception) -> None:
        error = _describe(exc)
        if not self.failing or error != self.last_error:
            log.error("could not write state file %s: %s (the drain goes on; retrying)",
                      self.path, error)
        self.failures += 1
        self.failing = True
        self.last_error = error
        self.last_error_at = self._clock()
        if self._retry is None and not self._closed:
            self._retry = asyncio.get_running_loop().call_later(self._retry_s, self._retry_now)
            self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)
        self._tell(False)

    def _tell(self, ok: bool) -> None:
        if self._on_result is None:
            return
        try:
            self._on_result(ok)
        except Exception:  # the owner's bookkeeping must not reach the drain either
            log.exception("state file %s: reporting a write result failed", self.path)

    def _retry_now(self) -> None:
        self._retry = None
        self._retry_task = asyncio.get_running_loop().create_task(self._retry_write())

    async def _retry_write(self) -> None:
        if await self._write_if_dirty():
            await self._write_soon()  # changes that waited for the retry


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"
