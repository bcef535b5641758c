"""Plain-text views of ``/status`` documents for people (the ``status`` and ``drain`` commands)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned text table."""
    cells = [[str(h) for h in headers], *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    delta = at - now
    return f"in {delta:.1f}s" if delta >= 0 else f"{-delta:.1f}s ago"


def drain_verdict(doc: dict[str, Any]) -> tuple[str | None, list[str], int | None]:
    """The drain's ``outcome``, ``causes`` and ``lost_requests`` from a ``/status`` document.

    They are read from ``drain`` (the current drain, ``done`` included), else ``last_drain``
    (after an abort); the top-level ``outcome`` wins when present (it can say ``timeout``).
    ``lost_requests`` is None when the document does not carry it."""
    drain = doc.get("drain") or doc.get("last_drain") or {}
    outcome = doc.get("outcome") or drain.get("outcome")
    causes = [str(c) for c in drain.get("causes") or ()]
    lost = drain.get("lost_requests")
    return (None if outcome is None else str(outcome), causes,
            None if lost is None else int(lost))


def _requests(count: int) -> str:
    return f"{count} request" if count == 1 else f"{count} requests"


def progress_line(doc: dict[str, Any]) -> str:
    """One line of drain progress."""
    workers = doc.get("workers", [])
    inflight = sum(w.get("inflight") or 0 for w in workers if w.get("state") != "exited")
    counts = doc.get("counts", {})
    ended = sum(v for k, v in counts.items() if k != "running")
    drain = doc.get("drain") or {}
    left = ""
    if drain.get("deadline_at"):
        left = f", {max(0.0, drain['deadline_at'] - time.time()):.1f}s of budget left"
    line = (f"[{doc['phase']}] gen {doc['generation']}: {len(workers)} workers, "
            f"{inflight} in flight, {len(doc.get('migrations', []))} migrations pending, "
            f"{ended}/{len(doc.get('processes', []))} processes ended{left}")
    outcome, causes, lost = drain_verdict(doc)
    if outcome is not None:
        line += f"; outcome {outcome}"
        if lost:
            line += f", {_requests(lost)} lost"
        if causes:
            line += ": " + " ".join(causes)
    return line


def status_text(doc: dict[str, Any]) -> str:
    """The whole status for a person."""
    now = time.time()
    out = [f"phase       {doc['phase']}  (generation {doc['generation']})"]
    drain = doc.get("drain")
    if drain:
        out.append(f"drain       {drain['reason']!r}, started {_ago(drain['started_at'], now)}, "
                   f"deadline {_ago(drain['deadline_at'], now)}")
    outcome, causes, lost = drain_verdict(doc)
    if outcome:
        out.append(f"outcome     {outcome}")
    out += [f"cause       {cause}" for cause in causes]
    if lost is not None:
        out.append(f"lost        {_requests(lost)} (handed back, expired unacknowledged)")
    mc = doc.get("migration_counts", {})
    out.append(f"migrations  {len(doc.get('migrations', []))} pending, "
               f"{mc.get('handed_back', 0)} handed back, {mc.get('acked', 0)} acknowledged, "
               f"{mc.get('expired', 0)} expired")
    workers = doc.get("workers", [])
    if workers:
        out += ["", table(["worker", "pid", "role", "state", "inflight", "stream", "url"], [
            [w["id"], w["pid"], w["role"], w["state"], w["inflight"],
             "open" if w.get("connected") else "-", w.get("url")] for w in workers])]
    processes = doc.get("processes", [])
    if processes:
        out += ["", summary_processes(processes)]
    counts = doc.get("counts")
    if counts:
        out += ["", "processes   " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)]
    return "\n".join(out)


def summary_processes(processes: list[dict[str, Any]]) -> str:
    """The processes table: how each one ended."""
    return table(["pid", "name", "role", "fate", "exit", "after ms", "signal"], [
        [p["pid"], p["name"], p.get("role"), p["fate"], p.get("exit_code"),
         None if p.get("elapsed_ms") is None else f"{p['elapsed_ms']:.1f}", p.get("signal")]
        for p in processes])
