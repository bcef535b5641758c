"""A drain drawn: the timeline of a ``/status`` document as SVG or as one HTML page.

Pure functions of the document (no clock, no I/O but ``write_svg``'s file); every string
from the document is escaped. ``GET /status/timeline`` serves ``render_html``;
``shutdown-coordinator status --timeline FILE.svg`` writes ``write_svg``. Where marks are
drawn is fixed by one scale (``Scale``, documented in ``coordinator.timeline.scale``).
"""

from __future__ import annotations

import os

from coordinator.files import replace_file
from coordinator.timeline.page import CSP
from coordinator.timeline.page import render as render_html
from coordinator.timeline.scale import Scale
from coordinator.timeline.svg import render as render_svg

__all__ = ["CSP", "Scale", "render_html", "render_svg", "save", "write_svg"]


def write_svg(document: object, path: str | os.PathLike[str]) -> None:
    """Write the SVG timeline of ``document`` (a ``/status`` document) to ``path``
    (replaced atomically: a reader never sees half a file)."""
    save(render_svg(document), path)


def save(text: str, path: str | os.PathLike[str]) -> None:
    """Write a drawn timeline to ``path``, replaced atomically through a temporary no planted
    link can redirect (``coordinator.files``)."""
    replace_file(path, text.encode("utf-8"))
