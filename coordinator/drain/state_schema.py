"""What a state file must hold to be restored: the whole document, checked before any of it
is used.

``validate(document)`` returns nothing or raises ``StateFileError`` naming the first problem
by its place in the document (``drain.outcomes[3].pid: expected an integer``). It checks
every key the restore reads: its presence, its JSON type, finite numbers inside sane bounds
(times, durations, PIDs, signals), the enumerations (phases, fates), and that the phase and
the drain agree (a drain phase needs its drain; ``serving`` has none). Keys it does not know
are ignored, so a newer writer may add some. Pure: no files, no clocks (``now`` is passed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from coordinator.drain.phases import Phase
from coordinator.kill.report import Fate

STATE_VERSION = 1

MAX_INT = 2**53
PID_MAX = 2**22
"""Linux's ``PID_MAX_LIMIT``."""
MAX_EPOCH_S = 1e11
"""Epoch seconds beyond any real clock (year 5138); larger ones are corrupt."""
MAX_BUDGET_S = 86_400.0
"""The longest budget a coordinator can be configured with (``--grace-period`` bound)."""
CLOCK_SLACK_S = 300.0
"""A drain that starts more than this after the reader's clock is corrupt (it would hold the
coordinator for longer than any budget it could have had)."""
MAX_DEPTH = 10_000

Check = Callable[[Any, str], None]


class StateFileError(ValueError):
    """A state file that cannot be restored; the message says where and why."""


def _fail(where: str, why: str) -> NoReturn:
    raise StateFileError(f"{where}: {why}" if where else why)


def _int(low: int = 0, high: int = MAX_INT) -> Check:
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, f"expected an integer, found {_kind(value)}")
        if not low <= value <= high:
            _fail(where, f"{value} is outside [{low}, {high}]")
    return check


def _num(low: float, high: float) -> Check:
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(where, f"expected a number, found {_kind(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not low <= number <= high:
            _fail(where, f"{value} is outside [{low:g}, {high:g}]")
    return check


def _str(value: Any, where: str) -> None:
    if not isinstance(value, str):
        _fail(where, f"expected a string, found {_kind(value)}")


def _bool(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        _fail(where, f"expected true or false, found {_kind(value)}")


def _anything(_value: Any, _where: str) -> None:
    return None


def _one_of(values: frozenset[str]) -> Check:
    def check(value: Any, where: str) -> None:
        _str(value, where)
        if value not in values:
            _fail(where, f"{value!r} is not one of {', '.join(sorted(values))}")
    return check


def _nullable(inner: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if value is not None:
            inner(value, where)
    return check


def _list(item: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            _fail(where, f"expected a list, found {_kind(value)}")
        for index, element in enumerate(value):
            item(element, f"{where}[{index}]")
    return check


def _mapping(value_check: Check) -> Check:
    """An object whose every value passes ``value_check`` (its keys are strings in JSON)."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, found {_kind(value)}")
        for key, item in value.items():
            value_check(item, _at(where, str(key)))
    return check


def _pair(first: Check, second: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) != 2:
            _fail(where, "expected a list of two")
        first(value[0], f"{where}[0]")
        second(value[1], f"{where}[1]")
    return check


def _object(required: Mapping[str, Check], optional: Mapping[str, Check] | None = None,
            ) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, found {_kind(value)}")
        for key, inner in required.items():
            if key not in value:
                _fail(where, f"missing key {key!r}")
            inner(value[key], _at(where, key))
        for key, inner in (optional or {}).items():
            if key in value:
                inner(value[key], _at(where, key))
    return check


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             type(None): "null", int: "an integer", float: "a number"}
    return names.get(type(value), type(value).__name__)


EPOCH = _num(0, MAX_EPOCH_S)
SECONDS = _num(0, MAX_BUDGET_S)
PID = _int(1, PID_MAX)
PHASE = _one_of(frozenset(p.value for p in Phase))

OUTCOME = _object(
    {"pid": PID, "name": _str, "fate": _one_of(frozenset(f.value for f in Fate))},
    {"start_time": _nullable(EPOCH), "cmdline": _str, "root_pid": _nullable(PID),
     "parent_pid": _nullable(_int(0, PID_MAX)), "depth": _int(0, MAX_DEPTH),
     "role": _nullable(_str), "tier": _nullable(_str), "signal": _nullable(_str),
     "signalled_at": _nullable(EPOCH), "kill_at": _nullable(EPOCH),
     "killed_at": _nullable(EPOCH),
     "ended_at": _nullable(EPOCH), "elapsed_ms": _nullable(_num(0, MAX_EPOCH_S)),
     "exit_code": _nullable(_int(-(2**31), 2**31)), "detail": _str},
)
DRAIN = _object(
    {"reason": _str, "started_at": EPOCH, "budget_s": SECONDS, "migration_s": SECONDS,
     "termination_s": SECONDS},
    {"min_drain_s": SECONDS, "outcome": _nullable(_str), "ended_at": _nullable(EPOCH),
     "kill": _nullable(_object({})), "force": _bool, "outcomes": _list(OUTCOME),
     "causes": _list(_str), "lost_requests": _int(), "cut_requests": _int(),
     "errors": _list(_str),
     "expired_before": _nullable(_int())},
)
TIER = _object(
    {"name": _str, "signal": _int(1, 64), "timeout_s": SECONDS},
    {"pattern": _nullable(_str), "roles": _list(_str), "include_root": _bool},
)
WORKER = _object(
    {"id": _str, "pid": PID, "start_time": EPOCH, "role": _str},
    {"name": _str, "url": _nullable(_str), "tiers": _list(TIER), "include_tree": _bool,
     "registered_at": EPOCH, "state": _str, "inflight": _nullable(_int()),
     "prekill_done": _bool, "handed_back": _int(), "exited_at": _nullable(EPOCH),
     "exit_code": _nullable(_int(-(2**31), 2**31)),
     "uids": _nullable(_pair(_int(0, 2**32 - 1), _int(0, 2**32 - 1))),
     "reach_uid": _nullable(_int(0, 2**32 - 1))},
)
MIGRATION = _object(
    {"request_id": _str, "worker": _str, "tokens": _int(), "handed_back_at": EPOCH},
    {"worker_url": _nullable(_str), "detail": _anything},
)
MIGRATIONS = _object(
    {},
    {"pending": _list(MIGRATION), "early": _list(_pair(_str, EPOCH)),
     "early_owners": _mapping(_int(0, 2**32 - 1)), "handed_back": _int(),
     "acked": _int(), "expired": _int(), "engine": _int()},
)
TRANSITION = _object({"phase": PHASE, "at": EPOCH, "generation": _int()}, {"note": _str})
DOCUMENT = _object(
    {"phase": PHASE, "generation": _int(), "timeline": _list(TRANSITION),
     "drain": _nullable(DRAIN), "workers": _list(WORKER), "migrations": MIGRATIONS},
    {"last": _nullable(DRAIN), "saved_at": EPOCH, "coordinator_pid": PID},
)


def validate(document: Any, now: float | None = None) -> None:
    """Raise ``StateFileError`` unless ``document`` can be restored whole (see the module
    docstring); ``now`` (epoch s) also refuses a drain that starts in the future."""
    if not isinstance(document, dict):
        _fail("", f"the document is {_kind(document)}, not an object")
    if "version" not in document:
        _fail("", "missing key 'version'")
    version = document["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        _fail("version", f"unknown version {version!r} (this coordinator reads {STATE_VERSION})")
    DOCUMENT(document, "")
    phase = Phase(document["phase"])
    drain = document["drain"]
    if phase is Phase.SERVING and drain is not None:
        _fail("drain", "a drain is recorded while the phase is serving")
    if phase is not Phase.SERVING and drain is None:
        _fail("drain", f"the phase is {phase.value} but no drain is recorded")
    for key in ("drain", "last"):
        record = document.get(key)
        if now is not None and record is not None and \
                record["started_at"] > now + CLOCK_SLACK_S:
            _fail(f"{key}.started_at", f"{record['started_at']} is in the future")
