"""The 422 answer of a request that failed validation, safe whatever the input was.

Validation errors echo parts of the input; a hostile input (deep nesting, ``NaN``, huge or
unserialisable values, lone surrogates) must still get a small JSON 4xx, never a 5xx, and is
never echoed whole: at most ``MAX_ERRORS`` errors, strings cut to ``MAX_ECHO_CHARS``, only
short finite scalars echoed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from fastapi.responses import Response

JSON = "application/json"
MAX_ERRORS = 20
"""A 422 lists at most this many validation errors."""
MAX_ECHO_CHARS = 200
"""Longest string (message, location part, echoed input) a 422 carries."""


def _clip(text: object) -> str:
    """``text`` as a short string that encodes as UTF-8 (lone surrogates replaced)."""
    value = str(text)
    if len(value) > MAX_ECHO_CHARS:
        value = value[:MAX_ECHO_CHARS] + "…"
    return value.encode("utf-8", "replace").decode("utf-8")


def _echo(value: object) -> object:
    """The offending input when it is a short JSON scalar; None for anything else (non-finite
    numbers, containers, whatever JSON cannot represent are never echoed)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _clip(value)
    return None


def invalid_input(errors: Sequence[Any]) -> Response:
    """The 422 of a request that failed validation: always JSON with a ``detail`` list of
    ``{"type", "loc", "msg"}`` (plus ``input`` when it is a short finite scalar), whatever the
    input was: hostile depth, ``NaN``, huge or unserialisable values are never echoed."""
    detail: list[dict[str, Any]] = []
    for error in list(errors)[:MAX_ERRORS]:
        if not isinstance(error, dict):
            detail.append({"type": "invalid", "loc": [], "msg": _clip(error)})
            continue
        location = error.get("loc", ())
        entry: dict[str, Any] = {
            "type": _clip(error.get("type", "invalid")),
            "loc": [part if isinstance(part, int) and not isinstance(part, bool)
                    else _clip(part) for part in list(location)[:32]]
            if isinstance(location, (list, tuple)) else [_clip(location)],
            "msg": _clip(error.get("msg", "invalid input")),
        }
        context = error.get("ctx")
        if isinstance(context, dict) and isinstance(context.get("error"), str):
            entry["ctx"] = {"error": _clip(context["error"])}  # e.g. where the JSON broke
        echoed = _echo(error.get("input"))
        if echoed is not None:
            entry["input"] = echoed
        detail.append(entry)
    if len(errors) > MAX_ERRORS:
        detail.append({"type": "too_many_errors", "loc": [],
                       "msg": f"{len(errors) - MAX_ERRORS} more errors left out"})
    try:
        body = json.dumps({"detail": detail}, allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):  # cannot happen; never answer 5xx
        body = b'{"detail": "invalid input"}'
    return Response(body, status_code=422, media_type=JSON)
