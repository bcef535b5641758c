"""The timeline as SVG text: phases as bands, one row per process (or per tier, past
``layout.COLLAPSE_AFTER``), marks at the recorded times.

Steps of ``render``:

    1. read the window from every time the timeline holds, and fix the one ``Scale``;
    2. the header: the drain's outcome, reason and start, and the axis (seconds from start);
    3. the handoff lane: handed back, acknowledged, expired, still pending;
    4. each group (a root's tree) under a header row that carries its worker's ``drain``
       push and ``shutdown_event`` marks, then its rows in the kill's order;
    5. behind everything, the phase bands and the deadlines; a legend at the bottom.

What each element carries for a reader (``data-*``): the root ``<svg>`` the scale
(``data-t0``, ``data-t1``, ``data-x0``, ``data-width``); a process row ``data-pid``,
``data-root``, ``data-tier``, ``data-fate``; a mark ``data-kind`` (``term``: the graceful
signal; ``due``: when SIGKILL was due; ``kill``: SIGKILL; ``exit``: its end was seen;
``push``, ``notified``; ``handed_back``, ``acked``, ``expired``, ``pending``), ``data-t`` (the
recorded time, exactly) and, for marks that stand for several, ``data-count``. Every mark is
drawn centred on ``Scale.x(data-t)``. Every string from the document is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.timeline import layout
from coordinator.timeline.model import Process, Timeline, Worker, read
from coordinator.timeline.scale import Scale
from coordinator.timeline.text import coordinate, epoch, offset, text, timestamp

WIDTH = 1200
LABEL_W = 310
"""Left column: tier, PID, name."""
PLOT_W = WIDTH - LABEL_W - 20
TOP = 52
"""Where the bands and rows start (title and axis above)."""
ROW_H = 16
HEADER_H = 20
PHASE_H = 16
"""The lane naming the phases, above the rows."""
LANE_H = 26
LEGEND_H = 30
BUCKET_PX = 3.0
"""Marks that stand for many (collapsed rows, handoffs) are merged per this many pixels."""
MAX_SINGLE_HANDOFFS = 200
"""Up to this many handoff events are drawn one mark each; more are merged per bucket."""

SVG_CSS = """
svg.timeline{font:11px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#fff}
.title{font-weight:bold;font-size:13px}
.muted{fill:#666}
.band{opacity:.55}
.p-draining{fill:#fff3c4}.p-migrating{fill:#d7ecff}.p-terminating{fill:#ffe0d6}
.p-done{fill:#e3f1e3}
.edge{stroke:#555;stroke-dasharray:4 3}
.grid{stroke:#ddd}
.header{fill:#f4f4f4}
.row:hover .bg,.tier-row:hover .bg{fill:#fffbe0}
.bg{fill:transparent}
.bar{opacity:.35}
.term{fill:#333}
.due{stroke:#c62828;stroke-dasharray:2 2}
.kill{stroke:#c62828;stroke-width:2;fill:none}
.exit{stroke:#222;stroke-width:.8}
.push{fill:#777}.notified{fill:#1565c0}
.handed_back{fill:#8e24aa}.acked{fill:#2e7d32}.expired{stroke:#c62828;stroke-width:2;fill:none}
.pending{fill:#fff;stroke:#8e24aa;stroke-width:1.5}
.f-exited{fill:#2e7d32}.f-failed{fill:#ef6c00}.f-killed{fill:#c62828}
.f-survived{fill:#6a1b9a}.f-gone{fill:#9e9e9e}.f-running{fill:#1565c0}.f-unknown{fill:#bbb}
"""

LOOKS = ("exited", "failed", "killed", "survived", "gone", "running")
"""Fate colours, in the legend's order (``failed``: exited with a code other than 0)."""


def render(document: object) -> str:
    """The SVG of the drain in ``document`` (a ``/status`` document)."""
    return draw(read(document))


def draw(timeline: Timeline) -> str:
    # Step 1: the window and its scale.
    drain = timeline.drain
    times = timeline.times()
    first, last = (min(times), max(times)) if times else (0.0, 0.0)
    origin = drain.started_at if drain is not None and drain.started_at is not None else first
    scale = Scale.around(first, last, LABEL_W, PLOT_W)
    # Step 2: header, step 3: handoffs, step 4: groups (laid out top to bottom).
    body: list[str] = []
    y = TOP + PHASE_H
    if timeline.handoffs or timeline.migration_counts.get("handed_back"):
        body += _handoff_lane(timeline, scale, y)
        y += LANE_H
    collapsed = layout.collapsed(timeline)
    drawn_rows = 0
    for group in layout.groups(timeline):
        body += _group_header(group, scale, y)
        y += HEADER_H
        for tier in group.tiers:
            if collapsed:
                if drawn_rows >= layout.MAX_TIER_ROWS:
                    continue
                body += _tier_row(tier, group.root_pid, scale, y)
                drawn_rows += 1
                y += ROW_H
            else:
                for process in tier.processes:
                    body += _process_row(process, scale, y, origin)
                    y += ROW_H
    notes = _notes(timeline, collapsed, drawn_rows)
    for note in notes:
        body.append(f'<text class="muted" x="8" y="{y + 13}">{text(note, 300)}</text>')
        y += ROW_H
    bottom = y
    # Step 5: bands and deadlines behind, legend below.
    behind = _bands(timeline, scale, bottom) + _edges(timeline, scale, bottom)
    height = bottom + LEGEND_H
    head = _head(timeline, scale, origin, height, bottom)
    return "".join([*head, *behind, *body, *_legend(bottom + 6), "</svg>\n"])


def _head(timeline: Timeline, scale: Scale, origin: float, height: int,
          bottom: int) -> list[str]:
    drain = timeline.drain
    if drain is None:
        title = "No drain yet: the processes the coordinator knows"
    else:
        parts = [f"Drain: {drain.outcome or timeline.phase or 'running'}",
                 f"reason {drain.reason or '—'}", f"started {timestamp(drain.started_at)}",
                 f"{len(timeline.processes)} processes"]
        if drain.force:
            parts.insert(1, "force")
        if timeline.which == "last_drain":
            parts.insert(0, "Last drain")
        title = " · ".join(parts)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" data-t0="{epoch(scale.t0)}" '
        f'data-t1="{epoch(scale.t1)}" data-x0="{epoch(scale.x0)}" '
        f'data-width="{epoch(scale.width)}" data-origin="{epoch(origin)}" '
        f'data-processes="{len(timeline.processes)}" '
        f'data-collapsed="{"true" if layout.collapsed(timeline) else "false"}">',
        f"<title>{text(title, 400)}</title>",
        f"<style>{SVG_CSS}</style>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
        f'<text class="title" x="8" y="18">{text(title, 400)}</text>',
    ]
    for at, seconds in scale.ticks(origin):
        x = coordinate(scale.x(at))
        out.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{TOP - 6}" y2="{bottom}"/>')
        out.append(f'<text class="muted" x="{x}" y="{TOP - 10}" text-anchor="middle">'
                   f"{_seconds(seconds)}</text>")
    out.append(f'<text class="muted" x="8" y="{TOP - 10}">seconds from the drain\'s start'
               "</text>")
    return out


def _seconds(value: float) -> str:
    if value == 0:
        return "0"
    formatted = f"{value:+.3f}".rstrip("0").rstrip(".")
    return f"{formatted} s"


def _bands(timeline: Timeline, scale: Scale, bottom: int) -> list[str]:
    out = []
    for band in timeline.bands:
        end = band.end if band.end is not None else scale.t1
        x0, x1 = scale.x(band.start), scale.x(end)
        phase = band.phase if band.phase.isidentifier() else "other"
        end_attr = f' data-t-end="{epoch(band.end)}"' if band.end is not None else ""
        out.append(
            f'<rect class="band p-{text(phase, 32)}" data-phase="{text(band.phase, 32)}" '
            f'data-t="{epoch(band.start)}"{end_attr} x="{coordinate(x0)}" y="{TOP}" '
            f'width="{coordinate(max(x1 - x0, 0.5))}" height="{bottom - TOP}">'
            f"<title>{text(band.phase, 32)} from {offset(band.start, scale.t0)}"
            f"{' — ' + text(band.note, 200) if band.note else ''}</title></rect>")
        if x1 - x0 > 7 * len(band.phase) + 6:
            out.append(f'<text x="{coordinate(x0 + 3)}" y="{TOP + 12}">'
                       f"{text(band.phase, 32)}</text>")
    return out


def _edges(timeline: Timeline, scale: Scale, bottom: int) -> list[str]:
    drain = timeline.drain
    if drain is None:
        return []
    out = []
    for at, kind, label in ((drain.started_at, "start", "start"),
                            (drain.migration_deadline_at, "migration_deadline",
                             "migration deadline"),
                            (drain.deadline_at, "deadline", "deadline")):
        if at is None:
            continue
        x = coordinate(scale.x(at))
        out.append(f'<line class="edge" data-kind="{kind}" data-t="{epoch(at)}" x1="{x}" '
                   f'x2="{x}" y1="{TOP}" y2="{bottom}"><title>{label}</title></line>')
    return out


def _handoff_lane(timeline: Timeline, scale: Scale, y: int) -> list[str]:
    counts = timeline.migration_counts
    summary = " · ".join(f"{name.replace('_', ' ')} {counts[name]}"
                         for name in ("handed_back", "acked", "expired", "pending")
                         if name in counts)
    out = [f'<g class="lane" data-lane="handoffs"><rect class="header" x="0" y="{y}" '
           f'width="{WIDTH}" height="{LANE_H - 2}" opacity=".5"/>',
           f'<text x="8" y="{y + 11}">handoffs</text>',
           f'<text class="muted" x="8" y="{y + 22}">{text(summary, 60)}</text>']
    rows = {"handed_back": y + 6, "pending": y + 6, "acked": y + 13, "expired": y + 20}
    many = len(timeline.handoffs) > MAX_SINGLE_HANDOFFS
    for kind, cy in rows.items():
        marks = [(h.at, h.count) for h in timeline.handoffs if h.event == kind]
        for at, x, count in (_buckets(marks, scale) if many else
                             [(at, scale.x(at), n) for at, n in sorted(marks)]):
            out.append(_mark(kind, at, x, cy, f"{count} {kind.replace('_', ' ')} at "
                             f"{timestamp(at)}", count=count))
    out.append("</g>")
    return out


def _buckets(marks: Iterable[tuple[float, int]],
             scale: Scale) -> list[tuple[float, float, int]]:
    """Marks merged per ``BUCKET_PX``: (first time, its x, total count), by time."""
    merged: dict[int, list[float]] = {}
    for at, count in sorted(marks):
        key = int(scale.x(at) // BUCKET_PX)
        if key in merged:
            merged[key][1] += count
        else:
            merged[key] = [at, float(count)]
    return [(at, scale.x(at), int(count)) for at, count in merged.values()]


def _mark(kind: str, at: float, x: float, cy: float, title: str, *, pid: int | None = None,
          count: int | None = None, look: str = "") -> str:
    """One mark of ``kind`` centred on (``x``, ``cy``)."""
    data = f'data-kind="{kind}" data-t="{epoch(at)}"'
    if pid is not None:
        data += f' data-pid="{pid}"'
    if count is not None:
        data += f' data-count="{count}"'
    c, top, bot, left, right = (coordinate(v) for v in (x, cy - 5, cy + 5, x - 4, x + 4))
    classes = kind + (f" f-{look}" if look else "")
    if kind in ("term", "handed_back", "push"):
        shape = f'<path class="m {classes}" {data} d="M{left},{top}L{right},{top}L{c},{bot}Z">'
        end = "</path>"
    elif kind == "due":
        shape = f'<line class="m {classes}" {data} x1="{c}" x2="{c}" y1="{top}" y2="{bot}">'
        end = "</line>"
    elif kind in ("kill", "expired"):
        shape = (f'<path class="m {classes}" {data} d="M{left},{top}L{right},{bot}'
                 f'M{right},{top}L{left},{bot}">')
        end = "</path>"
    else:  # exit, notified, acked, pending
        shape = f'<circle class="m {classes}" {data} cx="{c}" cy="{coordinate(cy)}" r="3.5">'
        end = "</circle>"
    return f"{shape}<title>{title}</title>{end}"


def _group_header(group: layout.Group, scale: Scale, y: int) -> list[str]:
    worker = group.worker
    if group.root_pid is None:
        label = "processes under no root"
    elif worker is not None:
        label = f"root {group.root_pid} · worker {worker.id} ({worker.role}) · {worker.state}"
    else:
        label = f"root {group.root_pid} · adopted"
    label += f" · {group.size} processes"
    root = f' data-root="{group.root_pid}"' if group.root_pid is not None else ""
    out = [f'<g class="group"{root}><rect class="header" x="0" y="{y}" width="{WIDTH}" '
           f'height="{HEADER_H - 2}"/><text x="8" y="{y + 13}">{text(label, 110)}</text>']
    if worker is not None:
        out += _worker_marks(worker, scale, y + HEADER_H / 2 - 1)
    out.append("</g>")
    return out


def _worker_marks(worker: Worker, scale: Scale, cy: float) -> list[str]:
    out = []
    if worker.pushed_at is not None:
        out.append(_mark("push", worker.pushed_at, scale.x(worker.pushed_at), cy,
                         f"drain pushed to worker {text(worker.id, 80)} at "
                         f"{timestamp(worker.pushed_at)}"))
    if worker.notified_at is not None:
        out.append(_mark("notified", worker.notified_at, scale.x(worker.notified_at), cy,
                         f"shutdown_event set in worker {text(worker.id, 80)} at "
                         f"{timestamp(worker.notified_at)}"))
    return out


def hover(process: Process, origin: float) -> str:
    """What a process row says on hover (escaped)."""
    code = "unknown" if process.exit_code is None else str(process.exit_code)
    lines = [f"pid {process.pid} {text(process.name, 64)}"
             + (f" ({text(process.role, 64)})" if process.role else ""),
             f"tier {text(process.tier, 64) or '—'} · {text(process.fate, 16)} · exit code {code}",
             f"{text(process.signal, 16) or 'signal'} {offset(process.signalled_at, origin)}"
             f" · SIGKILL due {offset(process.kill_at, origin)}"
             f" · SIGKILL {offset(process.killed_at, origin)}"
             f" · ended {offset(process.ended_at, origin)}"]
    if process.detail:
        lines.append(text(process.detail, 500))
    if process.cmdline:
        lines.append(text(process.cmdline, 300))
    return "\n".join(lines)


def _process_row(process: Process, scale: Scale, y: int, origin: float) -> list[str]:
    cy = y + ROW_H / 2
    look = process.look
    out = [f'<g class="row" data-pid="{process.pid}" data-root="{process.root_pid or ""}" '
           f'data-tier="{text(process.tier, 64)}" data-fate="{text(process.fate, 16)}">'
           f"<title>{hover(process, origin)}</title>",
           f'<rect class="bg" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}"/>',
           f'<text class="muted" x="8" y="{y + 12}">{text(process.tier, 14)}</text>',
           f'<text x="110" y="{y + 12}">{process.pid} {text(process.name, 16)}</text>',
           f'<text class="f-{look}" x="{LABEL_W - 8}" y="{y + 12}" text-anchor="end">'
           f"{text(_short(process), 12)}</text>"]
    start = process.signalled_at
    end = process.ended_at or process.killed_at
    if start is not None:
        stop = end if end is not None else scale.t1
        x0, x1 = scale.x(start), scale.x(stop)
        out.append(f'<rect class="bar f-{look}" x="{coordinate(x0)}" y="{coordinate(cy - 3)}" '
                   f'width="{coordinate(max(x1 - x0, 1))}" height="6"/>')
    for kind, at in (("term", process.signalled_at), ("due", process.kill_at),
                     ("kill", process.killed_at), ("exit", process.ended_at)):
        if at is None or (kind == "due" and process.killed_at is None
                          and process.fate != "running"):
            continue
        out.append(_mark(kind, at, scale.x(at), cy, f"{_KIND_WORDS[kind]} "
                         f"{offset(at, origin)}", pid=process.pid,
                         look=look if kind == "exit" else ""))
    out.append("</g>")
    return out


_KIND_WORDS = {"term": "graceful signal", "due": "SIGKILL due", "kill": "SIGKILL",
               "exit": "ended"}


def _short(process: Process) -> str:
    if process.fate == "exited":
        return "exit ?" if process.exit_code is None else f"exit {process.exit_code}"
    return process.fate


def _tier_row(tier: layout.Tier, root: int | None, scale: Scale, y: int) -> list[str]:
    cy = y + ROW_H / 2
    looks: dict[str, int] = {}
    for process in tier.processes:
        looks[process.look] = looks.get(process.look, 0) + 1
    counts = ", ".join(f"{n} {look}" for look, n in sorted(looks.items(), key=lambda i: -i[1]))
    worst = next((look for look in ("survived", "killed", "failed", "running", "gone",
                                    "exited") if look in looks), "unknown")
    out = [f'<g class="tier-row" data-root="{root or ""}" data-tier="{text(tier.name, 64)}" '
           f'data-count="{len(tier.processes)}"><title>tier {text(tier.name, 64)}: '
           f"{len(tier.processes)} processes ({text(counts, 200)})</title>",
           f'<rect class="bg" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}"/>',
           f'<text class="muted" x="8" y="{y + 12}">{text(tier.name, 14)}</text>',
           f'<text x="110" y="{y + 12}">{len(tier.processes)} processes</text>',
           f'<text class="f-{worst}" x="{LABEL_W - 8}" y="{y + 12}" text-anchor="end">'
           f"{text(counts, 22)}</text>"]
    starts = [p.signalled_at for p in tier.processes if p.signalled_at is not None]
    ends = [t for p in tier.processes for t in (p.ended_at or p.killed_at,) if t is not None]
    if starts:
        x0 = scale.x(min(starts))
        x1 = scale.x(max(ends)) if ends else scale.x(scale.t1)
        out.append(f'<rect class="bar f-{worst}" x="{coordinate(x0)}" y="{coordinate(cy - 3)}" '
                   f'width="{coordinate(max(x1 - x0, 1))}" height="6"/>')
    for kind, picked in (("term", [p.signalled_at for p in tier.processes]),
                         ("kill", [p.killed_at for p in tier.processes]),
                         ("exit", [p.ended_at for p in tier.processes])):
        marks = [(t, 1) for t in picked if t is not None]
        for at, x, count in _buckets(marks, scale):
            out.append(_mark(kind, at, x, cy, f"{count}: {_KIND_WORDS[kind]} from "
                             f"{timestamp(at)}", count=count, look=worst if kind == "exit"
                             else ""))
    out.append("</g>")
    return out


def _notes(timeline: Timeline, collapsed: bool, drawn_rows: int) -> list[str]:
    notes = []
    if collapsed:
        tiers = sum(len(g.tiers) for g in layout.groups(timeline))
        notes.append(f"{len(timeline.processes)} processes: one row per tier "
                     f"(more than {layout.COLLAPSE_AFTER}); every process is in the table")
        if tiers > drawn_rows:
            notes.append(f"{tiers - drawn_rows} more tiers not drawn")
    if timeline.left_out:
        notes.append(f"{timeline.left_out} more processes not read")
    return notes


def _legend(y: int) -> list[str]:
    out = [f'<g class="legend" transform="translate(8,{y})">']
    x = 0
    for look in LOOKS:
        out.append(f'<rect class="f-{look}" x="{x}" y="4" width="10" height="10"/>'
                   f'<text x="{x + 14}" y="13">{look}</text>')
        x += 14 + 7 * len(look) + 12
    for kind, words in (("term", "graceful signal"), ("due", "SIGKILL due"),
                        ("kill", "SIGKILL"), ("exit", "ended"), ("notified", "shutdown_event"),
                        ("acked", "acknowledged")):
        out.append(_legend_mark(kind, x + 5, 9) + f'<text x="{x + 14}" y="13">{words}</text>')
        x += 14 + 7 * len(words) + 12
    out.append("</g>")
    return out


def _legend_mark(kind: str, x: float, cy: float) -> str:
    shape = _mark(kind, 0.0, x, cy, "")
    # The legend's marks stand for no time: drop their data so readers never count them.
    return shape.replace(' data-kind="', ' data-legend="').replace(' data-t="0.0"', "")
