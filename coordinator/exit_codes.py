"""Exit codes of the ``shutdown-coordinator`` command, as named constants.

``serve`` exits ``OK`` after a SIGTERM (once any running drain has ended). ``drain`` maps the
drain's outcome to one code so a script (or a ``preStop`` exec hook) can tell what happened.
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

OUTCOME_CODES: dict[str, int] = {
    "graceful": OK,
    "killed": KILLED,
    "survived": SURVIVED,
    "timeout": SURVIVED,
    "aborted": ABORTED,
}
"""Exit code of ``drain`` for each drain ``outcome`` in the summary."""
