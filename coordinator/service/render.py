"""Plain-text views of ``/status`` documents for people (the ``status`` and ``drain`` commands).

One rendering rule for text that comes from outside (command lines, process names, a
drain's reason, URLs, errors, causes): ``shown`` writes every character ``str.isprintable``
calls unprintable as an escape (``\\n``, ``\\t``, ``\\x1b``, ``\\u202e``: controls, bidi
and other format characters, line separators, spaces other than the space), so no value
can break a table's rows, move the cursor, colour the terminal or reorder what is shown.
Every table cell goes through it (``table``), and every such value in a line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value: object) -> str:
    """``value`` as text safe to print in a terminal line (see the module's docstring).
    Backslashes are kept as they are: this is for reading, not for parsing back."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned text table; every cell ``shown``, so none spans two rows."""
    cells = [[shown(h) for h in headers],
             *[["-" if v is None else shown(v) for v in r] for r in rows]]
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


def progress_line(doc: dict[str, Any], now: float | None = None,
                  width: int | None = None) -> str:
    """One line of drain progress, as of ``now`` (epoch s; the current time by default).

    With ``width`` (a terminal's columns) a line that would not fit is told shorter, the
    process waited on and its SIGKILL countdown first, then cut to ``width``."""
    now = time.time() if now is None else now
    workers = doc.get("workers", [])
    inflight = sum(w.get("inflight") or 0 for w in workers if w.get("state") != "exited")
    inflight += (doc.get("engine_inflight") or {}).get("inflight") or 0
    counts = doc.get("counts", {})
    ended = sum(v for k, v in counts.items() if k != "running")
    processes = len(doc.get("processes", []))
    migrations = len(doc.get("migrations", []))
    drain = doc.get("drain") or {}
    left_s = (max(0.0, drain["deadline_at"] - now) if drain.get("deadline_at") else None)
    verdict = shown(_verdict_text(doc))
    left = "" if left_s is None else f", {left_s:.1f}s of budget left"
    line = (f"[{shown(doc['phase'])}] gen {doc['generation']}: {len(workers)} workers, "
            f"{inflight} in flight, {migrations} migrations pending, "
            f"{ended}/{processes} processes ended{left}")
    waiting = waiting_on(doc, now)
    if waiting:
        line += f"; {waiting}"
    line += verdict
    if width is None or len(line) <= width:
        return line
    parts = [f"[{shown(doc['phase'])}]"]
    short_wait = _waiting_short(doc, now)
    if short_wait:
        parts.append(short_wait + ";")
    parts.append(f"{ended}/{processes} ended")
    if inflight:
        parts[-1] += f", {inflight} in flight"
    if migrations:
        parts[-1] += f", {migrations} migrations pending"
    if left_s is not None:
        parts[-1] += f", {left_s:.1f}s left"
    return (" ".join(parts) + verdict)[:width]


def _verdict_text(doc: dict[str, Any]) -> str:
    outcome, causes, lost = drain_verdict(doc)
    if outcome is None:
        return ""
    text = f"; outcome {outcome}"
    if lost:
        text += f", {_requests(lost)} lost"
    if causes:
        text += ": " + " ".join(causes)
    return text


def _engine_text(reading: dict[str, Any]) -> str:
    """The adopted engine's in-flight count as its metrics last said it."""
    count = reading.get("inflight")
    text = "in flight unknown" if count is None else f"{count} in flight"
    if reading.get("root") is not None:
        text += f" (the tree of pid {reading['root']})"
    text += f", from {reading['url']}"
    if reading.get("error"):
        text += f": {reading['error']}"
    return text


def _router_text(router: dict[str, Any]) -> str:
    """A router this pod's engine is taken out of when a drain starts, and how that went."""
    text = f"{router.get('kind')} {router.get('url')}: {router.get('state')}"
    details = []
    if router.get("attempts"):
        details.append(f"{router['attempts']} attempt" + ("s" if router["attempts"] > 1 else ""))
    if router.get("took_ms") is not None:
        details.append(f"{router['took_ms']:.0f} ms")
    if details:
        text += f" ({', '.join(details)})"
    if router.get("error"):
        text += f": {router['error']}"
    return text


def _group_text(group: dict[str, Any]) -> str:
    """This pod's place in its group drain (docs/group.md), and how the group stands."""
    text = f"{group.get('role')} {group.get('index')} of {group.get('size')}"
    if group.get("role") == "follower":
        leader = group.get("leader") or {}
        text += f", {group.get('state')}, leader {group.get('leader_url')}"
        if leader.get("reachable") is False:
            text += f" unreachable ({leader.get('error')})"
    else:
        members = group.get("members") or []
        text += f", {len(members)} of {max(0, int(group.get('size') or 1) - 1)} followers known"
    if group.get("mode") == "local":
        text += f"; drained alone: {group.get('reason')}"
    summary = group.get("summary") or {}
    reported = sum(1 for p in summary.get("pods") or () if p.get("reported"))
    if reported:
        text += (f"; group summary {reported}/{len(summary.get('pods') or ())} pods"
                 + (f", {summary['outcome']}" if summary.get("outcome") else ""))
    return text


def status_text(doc: dict[str, Any]) -> str:
    """The whole status for a person."""
    now = time.time()
    out = [f"phase       {doc['phase']}  (generation {doc['generation']})"]
    security = doc.get("security") or {}
    if security:
        out.append(f"security    auth {'on' if security.get('auth') else 'OFF'}, bind "
                   f"{security.get('host')}"
                   + (" (loopback)" if security.get("loopback") else " (network)"))
    settings = doc.get("settings") or {}
    if settings:
        out.append(f"budget      {settings['budget_s']:g}s: {settings['migration_s']:g}s to "
                   f"migrate, {settings['termination_s']:g}s to terminate "
                   f"(tiers of {settings['tier_timeout_s']:g}s)")
    drain = doc.get("drain")
    if drain:
        out.append(f"drain       {_drain_text(drain, now)}")
    outcome, causes, lost = drain_verdict(doc)
    if outcome:
        out.append(f"outcome     {shown(outcome)}")
    out += [f"cause       {shown(cause)}" for cause in causes]
    if lost is not None:
        out.append(f"lost        {_requests(lost)} (handed back, expired unacknowledged)")
    watch = (doc.get("drain") or {}).get("escapes") or doc.get("escapes")
    if watch:
        out.append(f"escapes     not watched for: {shown(watch.get('detail'))}")
    engine = doc.get("engine_inflight")
    if engine:
        out.append(f"engine      {shown(_engine_text(engine))}")
    out += [f"router      {shown(_router_text(r))}" for r in doc.get("routers") or ()]
    if doc.get("group"):
        out.append(f"group       {shown(_group_text(doc['group']))}")
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
    counted = ", ".join(f"{v} {shown(k)}" for k, v in (doc.get("counts") or {}).items() if v)
    if counted:
        out += ["", "processes   " + counted]
    elif not processes:
        out += ["", "processes   none registered or adopted"]
    return "\n".join(out)


def _drain_text(drain: dict[str, Any], now: float) -> str:
    """Why and when the drain started; while it runs, when its budget ends; once it ended,
    when and how much of its budget it took (its deadline no longer matters)."""
    text = f"'{shown(drain.get('reason'))}', started {_ago(drain.get('started_at'), now)}"
    ended, started = drain.get("ended_at"), drain.get("started_at")
    if ended is None or started is None:
        return text + f", deadline {_ago(drain.get('deadline_at'), now)}"
    text += f", ended {_ago(ended, now)}, after {max(0.0, ended - started):.1f}s"
    budget = drain.get("budget_s")
    return text + (f" of its {budget:g}s budget" if isinstance(budget, int | float) else "")


def _tree_order(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each root followed by its descendants, depth first (parents before children)."""
    by_parent: dict[int | None, list[dict[str, Any]]] = {}
    pids = {p["pid"] for p in processes}
    for p in sorted(processes, key=lambda p: p["pid"]):
        parent = p.get("parent_pid") if p.get("parent_pid") in pids and p.get("depth") else None
        by_parent.setdefault(parent, []).append(p)
    ordered: list[dict[str, Any]] = []
    stack = list(reversed(by_parent.get(None, [])))
    while stack:
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(by_parent.get(node["pid"], [])))
    seen = {p["pid"] for p in ordered}
    return ordered + [p for p in processes if p["pid"] not in seen]


def _ms_after(at: float | None, origin: float | None) -> str | None:
    if at is None or origin is None:
        return None
    return f"+{(at - origin) * 1000:.0f}"


def short_command(cmdline: str | None, width: int) -> str | None:
    """A command line for a table column: the program by its base name (an install path says
    little and would push the arguments that tell processes apart out of the column), then the
    arguments, cut to ``width`` characters."""
    if not cmdline:
        return None
    program, _, rest = cmdline.partition(" ")
    short = program.rsplit("/", 1)[-1] + (" " + rest if rest else "")
    return (short[:width] + "…") if len(short) > width else short


def summary_processes(processes: list[dict[str, Any]]) -> str:
    """The processes as a tree: how each one ended (or is running), its tier and signal, when
    it was signalled and ended (ms after the kill's first signal), and why."""
    first = min((p["signalled_at"] for p in processes if p.get("signalled_at")), default=None)
    rows = []
    for p in _tree_order(processes):
        indent = "  " * min(int(p.get("depth") or 0), 8)
        rows.append([
            p["pid"], indent + str(p["name"]), p.get("role"), p.get("tier"), p["fate"],
            p.get("exit_code"), p.get("signal"), _ms_after(p.get("signalled_at"), first),
            _ms_after(p.get("ended_at"), first),
            short_command(p.get("cmdline"), 48),
            p.get("detail") or None])
    return table(["pid", "process", "role", "tier", "fate", "exit", "signal", "signalled ms",
                  "ended ms", "command", "detail"], rows)


def plan_text(plan: dict[str, Any]) -> str:
    """The kill as it would run now, tier by tier, with what the drain's budget gives each
    tier before its SIGKILL (the least and the most, ``coordinator/service/plan.py``)."""
    rows = []
    for order, tier in enumerate(plan.get("tiers", []), start=1):
        waits = _waits(tier)
        for p in tier["processes"]:
            rows.append([order, tier["tier"], f"{tier['timeout_s']:g}s", waits, p["signal"],
                         p["pid"], p["name"], p.get("role"),
                         short_command(p.get("cmdline"), 60)])
    lines = [f"kill plan: {len(plan.get('tiers', []))} tiers, {plan.get('processes', 0)} "
             "processes, in this order (each tier: its signal, then SIGKILL for what remains "
             "after the time shown)"]
    budget = plan.get("budget")
    if budget:
        lines.append(
            f"budget {budget['budget_s']:g}s: the kill gets {budget['kill_least_s']:.1f}s (its "
            f"{budget['termination_s']:g}s share, once migration takes all of its "
            f"{budget['migration_s']:g}s) to {budget['kill_most_s']:.1f}s (nothing to "
            "migrate); a tier's SIGKILL comes after its timeout at the most, sooner when the "
            "budget is short: `SIGKILL after` is the least (every tier before it stubborn) to "
            "the most")
    lines += [f"warning: {shown(w)}" for w in plan.get("warnings") or ()]
    if not rows:
        return "\n".join([*lines, "(nothing to stop)"])
    return "\n".join([*lines, table(["step", "tier", "timeout", "SIGKILL after", "signal",
                                      "pid", "process", "role", "command"], rows)])


def _waits(tier: dict[str, Any]) -> str:
    wait = tier.get("wait_s")
    if not isinstance(wait, dict):
        return "-"
    least, most = float(wait["least"]), float(wait["most"])
    return f"{most:.1f}s" if f"{least:.1f}" == f"{most:.1f}" else f"{least:.1f}-{most:.1f}s"


def _waited(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The process the kill waits on now: signalled (or SIGKILLed), not yet ended; the
    earliest signalled."""
    waiting = [p for p in doc.get("processes", [])
               if (p.get("signalled_at") or p.get("killed_at")) and p.get("fate") == "running"]
    return min(waiting, key=lambda p: p.get("signalled_at") or p["killed_at"], default=None)


def _sigkill_when(p: dict[str, Any], now: float) -> str | None:
    """``SIGKILL in 1.8s`` (its ``kill_at`` to come) or ``SIGKILL 0.1s ago`` (sent)."""
    if p.get("killed_at"):
        return f"SIGKILL {now - p['killed_at']:.1f}s ago"
    if p.get("kill_at"):
        return f"SIGKILL in {max(0.0, p['kill_at'] - now):.1f}s"
    return None


def waiting_on(doc: dict[str, Any], now: float | None = None) -> str | None:
    """The process the kill waits on now, its tier, how long ago it got its signal and when
    its SIGKILL comes (``kill_at``) or came, as of ``now`` (epoch s; the current time by
    default)."""
    p = _waited(doc)
    if p is None:
        return None
    now = time.time() if now is None else now
    when = []
    if p.get("signalled_at"):
        when.append(f"{p.get('signal')} {now - p['signalled_at']:.1f}s ago")
    sigkill = _sigkill_when(p, now)
    if sigkill:
        when.append(sigkill)
    return (f"waiting on {p['pid']} {shown(p['name'])} (tier {shown(p.get('tier') or '-')}, "
            f"{', '.join(when)})")


def _waiting_short(doc: dict[str, Any], now: float) -> str | None:
    p = _waited(doc)
    if p is None:
        return None
    sigkill = _sigkill_when(p, now)
    return f"waiting on {p['pid']} {shown(p['name'])}" + (f", {sigkill}" if sigkill else "")
