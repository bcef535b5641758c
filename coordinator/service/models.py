"""Request bodies of the HTTP API, with bounds that turn absurd input into a 422."""

from __future__ import annotations

import re
import signal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_PID = 4_194_304
"""Linux's largest possible ``pid_max``."""

RequestId = Annotated[str, Field(min_length=1, max_length=256)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]


class DrainRequest(BaseModel):
    """``POST /drain`` body (every field optional)."""

    model_config = ConfigDict(extra="forbid")

    wait: bool = True
    """Block until the drain is done (or its budget ends); false answers 202 at once."""
    deadline_s: Seconds | None = None
    """A shorter budget for this drain; it can never lengthen the configured one."""
    reason: str = Field("requested", min_length=1, max_length=200)
    force: bool = False
    """Skip migration and SIGKILL every process at once; joining a running drain escalates it
    (see docs/service.md)."""


class TierRequest(BaseModel):
    """One kill tier a worker declares for its own tree."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    pattern: str | None = Field(None, max_length=512)
    roles: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list,
                                                             max_length=32)
    signal: str = Field("SIGTERM", max_length=16)
    timeout_s: Seconds | None = None
    include_root: bool = False
    """Signal the registered root in this tier's place (when the tier matches it) instead of
    last."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from exc
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


class RegisterRequest(BaseModel):
    """``POST /workers`` body."""

    model_config = ConfigDict(extra="ignore")

    pid: int = Field(ge=1, le=MAX_PID)
    role: str = Field("worker", min_length=1, max_length=64)
    url: str | None = Field(None, max_length=2048)
    name: str | None = Field(None, max_length=256)
    start_time: float | None = Field(None, ge=0, le=1e11)
    """Epoch seconds; when given it must match the live process (PID reuse guard)."""
    tiers: list[TierRequest] = Field(default_factory=list, max_length=32)
    include_tree: bool = True


class Handoff(BaseModel):
    """One request a worker handed back."""

    request_id: RequestId
    tokens: int = Field(0, ge=0, le=1_000_000_000)
    detail: str | dict[str, Any] | None = None
    ack: Literal["router", "engine"] = "router"
    """``engine``: the engine's own router already migrated the request and will never
    acknowledge it here, so it is counted but never pending."""


class ReportRequest(BaseModel):
    """``POST /workers/{id}/report`` body."""

    inflight: int | None = Field(None, ge=0, le=1_000_000_000)
    handoffs: list[Handoff] = Field(default_factory=list, max_length=10_000)
    prekill_done: bool | None = None
    notified_at: float | None = Field(None, ge=0, le=1e11)
    """Epoch seconds at which the worker's ``shutdown_event`` was set for this drain."""


class AckRequest(BaseModel):
    """``POST /migrations/ack`` body."""

    request_ids: list[RequestId] = Field(max_length=10_000)
