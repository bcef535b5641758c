"""The preStop hook is stdlib-only (it runs in the engine's image), so it carries its own copy
of the CLI's exit codes; this keeps the copy equal to ``coordinator.exit_codes``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from coordinator import exit_codes

HOOK = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "drain_hook.py"
NAMES = ("OK", "KILLED", "SURVIVED", "ABORTED", "UNREACHABLE", "AUTH_FAILED", "REFUSED",
         "SIGNALLED", "FAILED", "LOST_REQUESTS", "ERROR", "UNVERIFIED", "NOTHING_TO_DRAIN")


def test_hook_exit_codes_are_the_cli_ones() -> None:
    """1. Load the hook as a module (it runs nothing on import).
    2. Every exit code it names, and its outcome→code table, equal the CLI's;
    3. every upper-case integer the CLI's module defines but those the hook leaves out
       (``NOT_IN_THE_HOOK``: USAGE, as the hook takes no command line worth a code,
       INTERRUPTED, as nobody presses Ctrl-C on a kubelet's hook, and ``serve``'s refusals
       of a state file, as the hook serves nothing) is in that list, so a new code cannot
       be forgotten."""
    spec = importlib.util.spec_from_file_location("drain_hook", HOOK)
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert {n: getattr(hook, n) for n in NAMES} == {n: getattr(exit_codes, n) for n in NAMES}
    assert hook.OUTCOME_CODES == exit_codes.OUTCOME_CODES
    defined = {n for n, v in vars(exit_codes).items() if n.isupper() and isinstance(v, int)}
    assert defined - exit_codes.NOT_IN_THE_HOOK == set(NAMES)
