"""Command-line patterns (adoption patterns, tier patterns, ``kill --pattern``), matched with
RE2.

A pattern may come from a registering worker, an operator's flag or an API caller, and is
searched in every command line on the host while the event loop waits. Python's ``re``
backtracks: ``(a+)+$`` against a command line of 40 ``a`` takes minutes, doubling with each
character. RE2 (Google's engine, the ``google-re2`` package) matches in time linear in the
text whatever the pattern, within a bounded memory budget. It has the usual syntax but no
backreferences and no lookaround; a pattern that uses them is refused when it is given (422,
or a usage error on the command line), never when a drain needs it.
"""

from __future__ import annotations

import functools
from typing import Any

import re2  # type: ignore[import-untyped]

MAX_PATTERN_CHARS = 1_000
"""Longest pattern accepted: RE2 compiles in time and memory that grow with the pattern."""
MAX_MEMORY_BYTES = 8 * 1024 * 1024
"""RE2's memory budget per pattern; a pattern that needs more is refused."""


class PatternError(ValueError):
    """A pattern RE2 cannot use; the message says why."""


@functools.lru_cache(maxsize=1024)
def compile_pattern(text: str) -> Any:
    """``text`` compiled with RE2 (cached), or ``PatternError``."""
    if len(text) > MAX_PATTERN_CHARS:
        raise PatternError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.log_errors = False  # the error is raised to the caller, not printed by RE2
    options.max_mem = MAX_MEMORY_BYTES
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"{text!r} is not a pattern RE2 accepts ({reason}); RE2 has no "
                           "backreferences or lookaround") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` (RE2 syntax) matches anywhere in ``text``."""
    return compile_pattern(pattern).search(text) is not None
