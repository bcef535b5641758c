"""Kill tiers written by hand: ``--adopt-tier`` flags and their JSON form.

Settings text, read by ``settings.py`` and the command line; the kill engine only ever sees
the ``TierSpec`` values made here.

Flag form: ``NAME=REGEX[:TIMEOUT_S[:SIGNAL]][:root]``. The regular expression may itself
contain colons (vLLM's titles are ``VLLM::EngineCore``), so the optional parts are peeled off
the right end, and only when they look like what they stand for: ``root`` for the marker, a
signal name after a number, a number. ``engine-core=VLLM::EngineCore:30`` is the pattern
``VLLM::EngineCore`` with a 30 s timeout; ``main=sglang\\.launch_server:30:SIGTERM:root`` also
lets the tier hold the root itself (``TierSpec.include_root``).

JSON form (the environment variable): a list whose items are flag strings or objects
``{"name", "pattern", "timeout_s"?, "signal"?, "include_root"?}``.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.kill import patterns
from coordinator.kill.policy import DEFAULT_TIER_TIMEOUT_S, TierSpec

ROOT_MARKER = "root"
USAGE = "NAME=REGEX[:TIMEOUT_S[:SIGNAL]][:root]"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_JSON_KEYS = frozenset({"name", "pattern", "timeout_s", "signal", "include_root"})


class TierSyntaxError(ValueError):
    """A tier written by hand that cannot be understood; the message says why."""


def signal_number(text: str) -> int:
    """``SIGTERM``, ``TERM`` or ``term`` → the signal's number; ``TierSyntaxError`` otherwise."""
    name = text.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if name not in signal.Signals.__members__:
        raise TierSyntaxError(f"{text!r} is not a signal name (e.g. SIGTERM, SIGINT)")
    return int(signal.Signals[name])


def _timeout(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def _checked_timeout(value: float, source: str) -> float:
    if not math.isfinite(value) or value <= 0 or value > 3_600:
        raise TierSyntaxError(f"{source}: the timeout must be seconds in (0, 3600], not {value}")
    return value


def _is_signal(text: str) -> bool:
    try:
        signal_number(text)
    except TierSyntaxError:
        return False
    return True


def _checked(name: str, pattern: str, timeout_s: float, sig: int, include_root: bool,
             source: str) -> TierSpec:
    if not _NAME.fullmatch(name):
        raise TierSyntaxError(
            f"{source}: the tier name must be letters, digits, '_', '.', '-' "
            f"(at most 64), not {name!r}")
    if not pattern:
        raise TierSyntaxError(f"{source}: the pattern is empty")
    try:
        patterns.compile_pattern(pattern)
    except patterns.PatternError as exc:
        raise TierSyntaxError(f"{source}: {exc}") from exc
    return TierSpec(name=name, pattern=pattern, signal=sig,
                    timeout_s=_checked_timeout(timeout_s, source), include_root=include_root)


def parse_tier(text: str) -> TierSpec:
    """One tier in flag form (see the module docstring); ``TierSyntaxError`` when malformed."""
    source = f"tier {text!r} (expected {USAGE})"
    name, sep, rest = text.partition("=")
    if not sep:
        raise TierSyntaxError(f"{source}: no '='")
    parts = rest.split(":")
    include_root = False
    if len(parts) > 1 and parts[-1].strip().lower() == ROOT_MARKER:
        include_root = True
        parts.pop()
    sig = int(signal.SIGTERM)
    timeout_s = DEFAULT_TIER_TIMEOUT_S
    if len(parts) > 2 and _timeout(parts[-2]) is not None and _is_signal(parts[-1]):
        sig = signal_number(parts.pop())
    if len(parts) > 1 and (value := _timeout(parts[-1])) is not None:
        timeout_s = value
        parts.pop()
    return _checked(name.strip(), ":".join(parts), timeout_s, sig, include_root, source)


def tier_from_mapping(data: Mapping[str, Any]) -> TierSpec:
    """One tier in JSON object form; ``TierSyntaxError`` when malformed."""
    source = f"tier {json.dumps(data)[:200]}"
    unknown = set(data) - _JSON_KEYS
    if unknown:
        raise TierSyntaxError(f"{source}: unknown keys {sorted(unknown)}")
    name, pattern = data.get("name"), data.get("pattern")
    if not isinstance(name, str) or not isinstance(pattern, str):
        raise TierSyntaxError(f"{source}: 'name' and 'pattern' must be strings")
    timeout = data.get("timeout_s", DEFAULT_TIER_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TierSyntaxError(f"{source}: 'timeout_s' must be a number")
    raw_signal = data.get("signal", "SIGTERM")
    if not isinstance(raw_signal, str):
        raise TierSyntaxError(f"{source}: 'signal' must be a name such as SIGTERM")
    include_root = data.get("include_root", False)
    if not isinstance(include_root, bool):
        raise TierSyntaxError(f"{source}: 'include_root' must be true or false")
    return _checked(name, pattern, float(timeout), signal_number(raw_signal), include_root,
                    source)


def parse_tiers(value: str | Iterable[Any]) -> list[TierSpec]:
    """Tiers from the environment (a JSON list, or one flag-form tier per line) or a list of
    flag strings, objects and ``TierSpec``s."""
    items: Iterable[Any]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError as exc:
                raise TierSyntaxError(f"tiers: not a JSON list: {exc}") from exc
        else:
            items = [line for line in text.splitlines() if line.strip()]
    else:
        items = value
    tiers: list[TierSpec] = []
    for item in items:
        if isinstance(item, TierSpec):
            tiers.append(item)
        elif isinstance(item, str):
            tiers.append(parse_tier(item.strip()))
        elif isinstance(item, Mapping):
            tiers.append(tier_from_mapping(item))
        else:
            raise TierSyntaxError(f"tiers: {item!r} is neither {USAGE} nor an object")
    return tiers
