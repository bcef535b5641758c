"""Exit codes of the ``shutdown-coordinator`` command, as named constants.

``serve`` exits ``OK`` after a SIGTERM (once any running drain has ended). ``drain`` maps the
drain's outcome (``coordinator.drain.outcome``) to one code so a script (or a ``preStop``
exec hook) can tell what happened: ``OUTCOME_CODES``. 0 means graceful and nothing else; the
codes of the judged outcomes follow their precedence (most severe first), except 3 and 4,
which are older than the rest and keep their numbers.

``deploy/kubernetes/base/drain_hook.py`` carries a copy (it must run on the standard library
alone); ``tests/deploy/test_drain_hook_codes.py`` keeps the two equal.
"""

from __future__ import annotations

OK = 0
"""Everything ended gracefully (``serve``: stopped on request)."""
USAGE = 2
"""Bad command line (argparse's own convention)."""
KILLED = 3
"""The drain finished, but at least one process needed SIGKILL."""
SURVIVED = 4
"""At least one process survived even SIGKILL (or the budget ended before ``done``)."""
ABORTED = 5
"""The drain was aborted (``DELETE /drain``) and the coordinator is serving again."""
UNREACHABLE = 6
"""The coordinator could not be reached, or answered something unexpected."""
AUTH_FAILED = 7
"""The coordinator refused the token (HTTP 401/403)."""
REFUSED = 8
"""The coordinator refused the request (another 4xx, e.g. a drain already past abort)."""
SIGNALLED = 9
"""A process died by a signal other than its graceful one (its own SIGKILL, SIGSEGV, ...)."""
FAILED = 10
"""A process exited non-zero, or a main process did not exit 0."""
LOST_REQUESTS = 11
"""Handed-back requests expired unacknowledged: no router said it continued them."""
ERROR = 12
"""The drain failed internally; its summary says what is known."""
UNVERIFIED = 13
"""Everything else was clean, but a main process's exit code could not be learned."""
NOTHING_TO_DRAIN = 14
"""No process was registered or adopted: the drain ended nothing (``kill``: no process to
end, every target already gone or no pattern matching)."""
STATE_FILE_LOCKED = 15
"""``serve``: another coordinator holds the ``--state-file`` (its lock), nothing listens."""
STATE_FILE_UNSAFE = 16
"""``serve``: another user could write or replace the ``--state-file`` (or its directory),
and so choose what a restart signals; nothing listens."""
INTERRUPTED = 130
"""Interrupted by SIGINT (Ctrl-C): 128 + 2, as a shell reports it. The command said on
stderr what goes on without it (a drain goes on in the coordinator) and how to stop it."""

NOT_IN_THE_HOOK = frozenset({"USAGE", "INTERRUPTED", "STATE_FILE_LOCKED", "STATE_FILE_UNSAFE"})
"""Codes the preStop hook's copy leaves out: it takes no command line worth a code, nobody
presses Ctrl-C on a kubelet's hook, and it serves nothing (``serve``'s refusals)."""

OUTCOME_CODES: dict[str, int] = {
    "graceful": OK,
    "survived": SURVIVED,
    "killed": KILLED,
    "signalled": SIGNALLED,
    "failed": FAILED,
    "lost_requests": LOST_REQUESTS,
    "error": ERROR,
    "unverified": UNVERIFIED,
    "nothing_to_drain": NOTHING_TO_DRAIN,
    "aborted": ABORTED,
    "timeout": SURVIVED,
}
"""Exit code of ``drain`` for each drain ``outcome`` in the summary (an unknown one: 4)."""


def describe() -> str:
    """The codes for ``--help``, one line each (the names say what they mean; the README
    and ``docs/service.md`` say more)."""
    named = sorted((value, name) for name, value in globals().items()
                   if name.isupper() and isinstance(value, int))
    lines = ["exit codes:"] + [f"  {value:>2}  {name}" for value, name in named]
    return "\n".join(lines)
