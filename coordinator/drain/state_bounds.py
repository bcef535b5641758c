"""A state document made to fit what its reader accepts, and what was dropped to make it fit.

The reader sets aside a file larger than ``MAX_STATE_BYTES`` (``state_file``) and starts
fresh: a coordinator restarted mid-drain would then serve, ready, with its engine no longer
a kill target. So the writer never writes one. ``fit(document)`` serializes the document;
when it is too large, it drops what a resumed drain can do without, in this order, and
serializes again after each step until it fits:

    1. the ``detail`` of every pending handoff (routers see the handoff, its tokens and its
       worker; the free-form detail, up to 16 KiB each, is what grows a document most);
    2. command lines of recorded processes, cut to ``CMDLINE_KEPT`` characters;
    3. the processes of ``last`` (the drain before this one: its outcome and causes stay);
    4. the timeline, but for its last ``TIMELINE_KEPT`` entries;
    5. the ``detail`` of recorded processes, cut to ``CMDLINE_KEPT`` characters;
    6. the kill tiers workers declared (a resumed kill then stops their trees in the
       default order, children first).

What each step dropped is counted in the document's ``dropped`` (and so in ``/status``
``state_file.dropped``). The phase, the drain, its deadlines, every process's identity and
fate, the workers and the handoffs themselves are never dropped: a document that does not
fit without them is not written (``StateTooLarge``), and the previous file stays.

Pure: no files, no clocks. ``document`` is not changed; a copy is.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

MAX_STATE_BYTES = 16 * 2**20
"""The largest state file the reader accepts (a pod's document is a few hundred KB)."""
CMDLINE_KEPT = 256
TIMELINE_KEPT = 8


class StateTooLarge(ValueError):
    """Even with everything droppable dropped, the document is larger than the reader
    accepts."""


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def fit(document: dict[str, Any], limit: int = MAX_STATE_BYTES,
        ) -> tuple[bytes, dict[str, int]]:
    """The document's bytes, at most ``limit`` of them, and what was dropped (empty when
    nothing was); ``StateTooLarge`` when it cannot fit."""
    data = encode(document)
    if len(data) <= limit:
        return data, {}
    shrunk = copy.deepcopy(document)
    dropped: dict[str, int] = {}
    for name, step in STEPS:
        count = step(shrunk)
        if count:
            dropped[name] = count
            shrunk["dropped"] = dict(dropped)
            data = encode(shrunk)
            if len(data) <= limit:
                return data, dropped
    raise StateTooLarge(f"the state document is {len(data)} bytes, more than the "
                        f"{limit} its reader accepts, even without {', '.join(dropped)}")


def _handoff_details(doc: dict[str, Any]) -> int:
    count = 0
    for migration in (doc.get("migrations") or {}).get("pending") or ():
        if migration.get("detail") is not None:
            migration["detail"] = None
            count += 1
    return count


def _outcomes(doc: dict[str, Any], *keys: str) -> list[dict[str, Any]]:
    return [o for key in keys for o in ((doc.get(key) or {}).get("outcomes") or ())]


def _cut(field: str) -> Callable[[dict[str, Any]], int]:
    def step(doc: dict[str, Any]) -> int:
        count = 0
        for outcome in _outcomes(doc, "drain", "last"):
            text = outcome.get(field)
            if isinstance(text, str) and len(text) > CMDLINE_KEPT:
                outcome[field] = text[:CMDLINE_KEPT]
                count += 1
        return count
    return step


def _last_processes(doc: dict[str, Any]) -> int:
    last = doc.get("last")
    if not last or not last.get("outcomes"):
        return 0
    count = len(last["outcomes"])
    last["outcomes"] = []
    return count


def _timeline(doc: dict[str, Any]) -> int:
    timeline = doc.get("timeline") or []
    count = max(0, len(timeline) - TIMELINE_KEPT)
    if count:
        doc["timeline"] = timeline[-TIMELINE_KEPT:]
    return count


def _worker_tiers(doc: dict[str, Any]) -> int:
    count = 0
    for worker in doc.get("workers") or ():
        if worker.get("tiers"):
            count += len(worker["tiers"])
            worker["tiers"] = []
    return count


STEPS: tuple[tuple[str, Callable[[dict[str, Any]], int]], ...] = (
    ("handoff_details", _handoff_details),
    ("command_lines_cut", _cut("cmdline")),
    ("last_drain_processes", _last_processes),
    ("timeline_entries", _timeline),
    ("process_details_cut", _cut("detail")),
    ("worker_tiers", _worker_tiers),
)
