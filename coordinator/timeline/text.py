"""Strings and numbers taken from a ``/status`` document, made safe to draw.

Everything a document holds is input from outside: a process's command line and name are
whatever the process set, a worker's role and a handoff's ``detail`` are whatever a caller
sent. So every string goes through ``text`` before it reaches the page, and every number
through ``number`` or ``integer``; nothing from the document is ever written raw.

- ``text``: characters XML 1.0 forbids (controls, lone surrogates, U+FFFE/U+FFFF) are
  replaced by U+FFFD, bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE and the like,
  which make a name read backwards) are shown as their escape (``\u202e``), the string is
  cut to a length, and ``& < > " '`` are escaped, so the result is safe as element text and
  as a quoted attribute value, in HTML and in SVG.
- ``number``: a finite float, or None for anything else (strings, booleans, NaN, infinity).
"""

from __future__ import annotations

import html
import math
import re
from datetime import UTC, datetime

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
"""What XML 1.0 does not allow in a document (and C0/DEL controls, which it discourages)."""
ELLIPSIS = "…"
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters that reorder the text around them: drawn raw, ``evil\u202egnp.exe`` reads as
``evilexe.png``. Shown as their escape instead."""


def escape_bidi(text: str) -> str:
    """``text`` with every bidirectional control shown as its escape (``\u202e``)."""
    return BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def plain(value: object, limit: int = 200) -> str:
    """``value`` as a string without forbidden characters, at most ``limit`` characters (cut
    ones end in an ellipsis). Not escaped: use ``text`` to write it."""
    if value is None:
        return ""
    string = value if isinstance(value, str) else str(value)
    if len(string) > limit:
        string = string[:max(limit - 1, 0)] + ELLIPSIS
    return escape_bidi(_NOT_XML.sub("\ufffd", string))


def text(value: object, limit: int = 200) -> str:
    """``value`` as escaped text, safe inside an element or a quoted attribute."""
    return html.escape(plain(value, limit), quote=True)


def number(value: object) -> float | None:
    """A finite number, or None for anything else (booleans included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def integer(value: object) -> int | None:
    """An integer that fits a JSON number exactly, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**53:
        return None
    return value


def timestamp(at: float | None) -> str:
    """Epoch seconds as UTC ISO 8601 to the millisecond; ``—`` when unknown."""
    if at is None:
        return "—"
    try:
        return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return "—"


def offset(at: float | None, origin: float) -> str:
    """``at`` relative to ``origin`` in seconds, signed (``+1.234 s``); ``—`` when unknown."""
    if at is None:
        return "—"
    return f"{at - origin:+.3f} s"


def coordinate(value: float) -> str:
    """A coordinate as written in the SVG: two decimals, no trailing zeros."""
    formatted = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if formatted in ("-0", "") else formatted


def epoch(value: float) -> str:
    """A recorded time as written in a ``data-t`` attribute: ``repr`` of the float, so a
    reader gets back exactly the number the document held."""
    return repr(value)
