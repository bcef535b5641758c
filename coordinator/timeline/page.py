"""The timeline as one self-contained HTML page: the SVG inline, the drain's summary and
causes, and a table with every process (up to ``MAX_LISTED``) in words.

No script, no external stylesheet, font or image: the page renders offline, and its
Content-Security-Policy (``CSP``, also sent as a header by ``GET /status/timeline``) lets the
browser load nothing else, not even when a string from the document were to slip through
unescaped (none does: see ``text.text``).
"""

from __future__ import annotations

import base64
import hashlib

from coordinator.timeline import svg
from coordinator.timeline.model import Timeline, read
from coordinator.timeline.text import offset, text, timestamp

MAX_LISTED = 2_000
"""Processes listed in the table; more are counted."""

PAGE_CSS = """
body{font:14px system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 8px}
.summary{display:flex;flex-wrap:wrap;gap:4px 24px;margin:0 0 8px}
.summary div{white-space:nowrap}
.causes li{margin:2px 0}
.scroll{overflow-x:auto;border:1px solid #ddd}
table{border-collapse:collapse;font:12px ui-monospace,Menlo,Consolas,monospace;margin-top:8px}
th,td{border-bottom:1px solid #eee;padding:2px 8px;text-align:left;vertical-align:top;
white-space:nowrap}
td.detail,td.cmd{max-width:32em;overflow-wrap:anywhere;white-space:normal}
tr.f-killed td.fate{color:#c62828}tr.f-failed td.fate{color:#ef6c00}
tr.f-survived td.fate{color:#6a1b9a}tr.f-exited td.fate{color:#2e7d32}
"""


def _hash(css: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()


PAGE_CSP = (f"default-src 'none'; style-src '{_hash(PAGE_CSS)}' '{_hash(svg.SVG_CSS)}'; "
            "img-src data:; base-uri 'none'; form-action 'none'")
"""Nothing but the page's own two stylesheets (by hash) and ``data:`` images: in the page's
own ``<meta>``, so a saved copy keeps it."""
CSP = PAGE_CSP + "; frame-ancestors 'none'"
"""The header ``GET /status/timeline`` sends (``frame-ancestors`` works only there)."""


def render(document: object) -> str:
    """The HTML page of the drain in ``document`` (a ``/status`` document)."""
    return build(read(document))


def build(timeline: Timeline) -> str:
    drain = timeline.drain
    origin = drain.started_at if drain is not None and drain.started_at is not None else 0.0
    title = ("Drain timeline" if drain is None or timeline.which == "drain"
             else "Last drain timeline")
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>{title} · shutdown-coordinator</title>",
        f"<style>{PAGE_CSS}</style></head><body>",
        f"<h1>{title}</h1>",
        *_summary(timeline),
        f'<div class="scroll">{svg.draw(timeline)}</div>',
        *_table(timeline, origin),
        "</body></html>\n",
    ]
    return "".join(parts)


def _summary(timeline: Timeline) -> list[str]:
    drain = timeline.drain
    if drain is None:
        return ["<p>No drain has run since this coordinator started (or since its state "
                "file was started).</p>"]
    items = [("phase", timeline.phase), ("outcome", drain.outcome or "—"),
             ("reason", drain.reason), ("started", timestamp(drain.started_at)),
             ("ended", offset(drain.ended_at, drain.started_at or 0.0)
              if drain.started_at is not None else "—"),
             ("deadline", offset(drain.deadline_at, drain.started_at or 0.0)
              if drain.started_at is not None else "—"),
             ("lost requests", "—" if drain.lost_requests is None else str(drain.lost_requests))]
    counts = timeline.migration_counts
    if counts:
        items.append(("handoffs", ", ".join(f"{k.replace('_', ' ')} {v}"
                                            for k, v in counts.items())))
    out = ['<div class="summary">']
    out += [f"<div><b>{name}</b> {text(value, 200)}</div>" for name, value in items]
    out.append("</div>")
    if drain.causes:
        out.append('<ul class="causes">')
        out += [f"<li>{text(cause, 1000)}</li>" for cause in drain.causes]
        out.append("</ul>")
    return out


def _table(timeline: Timeline, origin: float) -> list[str]:
    processes = timeline.processes
    if not processes:
        return []
    shown = processes[:MAX_LISTED]
    out = [f"<details{' open' if len(processes) <= 50 else ''}><summary>Every process "
           f"({len(processes)})</summary><table><thead><tr><th>pid</th><th>name</th>"
           "<th>role</th><th>root</th><th>depth</th><th>tier</th><th>fate</th><th>exit</th>"
           "<th>signal</th><th>signalled</th><th>SIGKILL due</th><th>SIGKILL</th>"
           "<th>ended</th><th>detail</th><th>command line</th></tr></thead><tbody>"]
    for p in shown:
        cells = [str(p.pid), text(p.name, 64), text(p.role, 64),
                 "" if p.root_pid is None else str(p.root_pid),
                 "" if p.depth is None else str(p.depth), text(p.tier, 64),
                 text(p.fate, 16), "" if p.exit_code is None else str(p.exit_code),
                 text(p.signal, 16), offset(p.signalled_at, origin),
                 offset(p.kill_at, origin), offset(p.killed_at, origin),
                 offset(p.ended_at, origin)]
        row = "".join(f"<td>{c}</td>" for c in cells[:6])
        row += f'<td class="fate">{cells[6]}</td>' + "".join(f"<td>{c}</td>" for c in cells[7:])
        row += f'<td class="detail">{text(p.detail, 500)}</td>'
        row += f'<td class="cmd">{text(p.cmdline, 300)}</td>'
        out.append(f'<tr class="f-{p.look}" data-pid="{p.pid}">{row}</tr>')
    out.append("</tbody></table>")
    if len(processes) > len(shown):
        out.append(f"<p>{len(processes) - len(shown)} more processes not listed.</p>")
    if timeline.left_out:
        out.append(f"<p>{timeline.left_out} more processes not read.</p>")
    out.append("</details>")
    return out
