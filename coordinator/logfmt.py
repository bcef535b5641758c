"""``key=value`` log lines: one record per fact, easy to grep and to parse once the pod and its
``/status`` are gone (a log collector keeps them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def logfmt(fields: Mapping[str, Any]) -> str:
    """``fields`` as ``key=value`` pairs; a value with spaces, quotes or ``=`` is quoted as
    JSON, ``None`` is ``-``, lists are joined by commas."""
    parts = []
    for key, value in fields.items():
        if value is None:
            text = "-"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value) or "-"
        else:
            text = str(value)
        if not text or any(c in text for c in ' "=\n\t'):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)
