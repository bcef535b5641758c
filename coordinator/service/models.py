"""Request bodies of the HTTP API, with bounds that turn absurd or hostile input into a 422.

Every field is bounded: strings by length (pydantic refuses lone surrogates in them),
lists by count, numbers by range and finite (``NaN``, ``Infinity`` and overflowing literals
such as ``1e309`` are refused). A handoff's free-form ``detail`` is bounded in nesting depth
and serialized size and may hold only finite numbers, so whatever a worker stores renders as
strict JSON in ``/status`` and in the state file.

Every field is also of its JSON type, strictly: ``"10"`` is no number, ``"no"`` and ``1``
are no booleans, ``true`` is no PID (an integer is still a number). And a URL holds no
control character or space: a CR/LF in one would split a log line or a header it is
written into.
"""

from __future__ import annotations

import json
import math
import re
import signal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from coordinator.kill import patterns

MAX_PID = 4_194_304
"""Linux's largest possible ``pid_max``."""

MAX_EPOCH_S = 1e11
"""Largest epoch time (seconds) a request may carry (year ~5138)."""
MAX_SECONDS = 86_400
"""Largest duration (seconds) a request may carry."""
MAX_COUNT = 1_000_000_000
"""Largest count (in-flight requests, tokens) a request may carry."""
MAX_LIST = 10_000
"""Most handoffs in one report, and request ids in one acknowledgement."""

DETAIL_MAX_DEPTH = 16
"""Deepest nesting of a handoff's ``detail`` (the object itself is depth 1)."""
DETAIL_MAX_BYTES = 16_384
"""Largest serialized size (compact JSON, UTF-8) of a handoff's ``detail``."""


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("not valid Unicode (a lone surrogate)") from exc
    return value


def _check_detail(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Refuse a ``detail`` nested deeper than ``DETAIL_MAX_DEPTH``, larger than
    ``DETAIL_MAX_BYTES`` serialized, holding a non-finite number or invalid Unicode, or
    holding anything JSON cannot represent. Walks iteratively: no recursion on hostile
    depth."""
    if value is None:
        return None
    if isinstance(value, str):
        if len(value.encode()) > DETAIL_MAX_BYTES:  # pydantic refused lone surrogates
            raise ValueError(f"detail is larger than {DETAIL_MAX_BYTES} bytes")
        return value
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > DETAIL_MAX_BYTES:
            raise ValueError(f"detail is larger than {DETAIL_MAX_BYTES} bytes")
        if isinstance(node, dict):
            if depth > DETAIL_MAX_DEPTH:
                raise ValueError(f"detail nests deeper than {DETAIL_MAX_DEPTH} levels")
            for key, item in node.items():
                if not isinstance(key, str):
                    raise ValueError("detail keys must be strings")
                _valid_unicode(key)
                stack.append((item, depth + 1))
        elif isinstance(node, list):
            if depth > DETAIL_MAX_DEPTH:
                raise ValueError(f"detail nests deeper than {DETAIL_MAX_DEPTH} levels")
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise ValueError("detail holds a number that is not finite (NaN or Infinity)")
        elif isinstance(node, str):
            _valid_unicode(node)
        elif not (node is None or isinstance(node, (bool, int))):
            raise ValueError(f"detail holds a {type(node).__name__}, not JSON")
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. an int too long to print
        raise ValueError("detail is not representable as JSON") from exc
    if size > DETAIL_MAX_BYTES:
        raise ValueError(f"detail is larger than {DETAIL_MAX_BYTES} bytes serialized ({size})")
    return value


RequestId = Annotated[str, Field(min_length=1, max_length=256)]
Label = Annotated[str, Field(min_length=1, max_length=64)]
"""A role or tier name."""
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Detail = Annotated[str | dict[str, Any] | None, AfterValidator(_check_detail)]


def _url_text(value: str | None) -> str | None:
    """Refuse a URL holding a control character (CR, LF, ...) or whitespace."""
    if value is not None and URL_REFUSED.search(value):
        raise ValueError("a URL may hold no control character (CR, LF, ...) or whitespace")
    return value


URL_REFUSED = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
Url = Annotated[str, Field(max_length=2048), AfterValidator(_url_text)]


class RequestBody(BaseModel):
    """Base of every request body: strict JSON types, floats finite."""

    model_config = ConfigDict(allow_inf_nan=False, strict=True)


class DrainRequest(RequestBody):
    """``POST /drain`` body (every field optional)."""

    model_config = ConfigDict(extra="forbid")

    wait: bool = True
    """Block until the drain is done (or its budget ends); false answers 202 at once."""
    deadline_s: Seconds | None = None
    """A shorter budget for this drain; it can never lengthen the configured one."""
    reason: Annotated[str, Field(min_length=1, max_length=200)] = "requested"
    force: bool = False
    """Skip migration and SIGKILL every process at once; joining a running drain escalates it
    (see docs/service.md)."""


class TierRequest(RequestBody):
    """One kill tier a worker declares for its own tree."""

    model_config = ConfigDict(extra="forbid")

    name: Label
    pattern: Annotated[str, Field(max_length=512)] | None = None
    roles: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list,
                                                             max_length=32)
    signal: Annotated[str, Field(max_length=16)] = "SIGTERM"
    timeout_s: Seconds | None = None
    include_root: bool = False
    """Signal the registered root in this tier's place (when the tier matches it) instead of
    last."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            patterns.compile_pattern(value)  # PatternError is a ValueError: a 422
        return value

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {value!r}")
        return name


class RegisterRequest(RequestBody):
    """``POST /workers`` body."""

    model_config = ConfigDict(extra="ignore")

    pid: int = Field(ge=1, le=MAX_PID)
    role: Label = "worker"
    url: Url | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    start_time: Epoch | None = None
    """Epoch seconds; when given it must match the live process (PID reuse guard)."""
    tiers: list[TierRequest] = Field(default_factory=list, max_length=32)
    include_tree: bool = True


class Handoff(RequestBody):
    """One request a worker handed back."""

    request_id: RequestId
    tokens: Count = 0
    detail: Detail = None
    """Free-form: a string, or a JSON object at most ``DETAIL_MAX_DEPTH`` deep and
    ``DETAIL_MAX_BYTES`` serialized, with finite numbers only."""
    ack: Literal["router", "engine"] = "router"
    """``engine``: the engine's own router already migrated the request and will never
    acknowledge it here, so it is counted but never pending."""


class ReportRequest(RequestBody):
    """``POST /workers/{id}/report`` body."""

    inflight: Count | None = None
    handoffs: list[Handoff] = Field(default_factory=list, max_length=MAX_LIST)
    prekill_done: bool | None = None
    notified_at: Epoch | None = None
    """Epoch seconds at which the worker's ``shutdown_event`` was set for this drain."""


class AckRequest(RequestBody):
    """``POST /migrations/ack`` body."""

    request_ids: list[RequestId] = Field(max_length=MAX_LIST)
    continued: list[RequestId] = Field(default_factory=list, max_length=MAX_LIST)
    """Streams this coordinator's drain ended (``--end-streams``) that the caller took over:
    the ids of the upstream attempts that ended."""
