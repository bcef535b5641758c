"""How a call to the coordinator fails, as the client commands' exit codes, in one place."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from coordinator import exit_codes


def client_errors_to_exit_codes(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``func`` with each client failure printed on stderr and returned as its exit code:
    a local file (the token) that cannot be read → ``USAGE``; the token refused →
    ``AUTH_FAILED``; the request refused → ``REFUSED``; the coordinator unreachable or
    answering nonsense → ``UNREACHABLE``."""

    def wrapper(args: argparse.Namespace) -> int:
        # Imported here, as it imports httpx: only the commands that call a coordinator pay.
        from coordinator.service.client import AuthError, ClientError, RefusedError

        try:
            return func(args)
        except OSError as exc:  # the token file (its message names the flag) or another
            # local file; a closed standard output never raises (``ending``)
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.USAGE
        except AuthError as exc:
            print(f"error: the coordinator refused the token: {exc}", file=sys.stderr)
            return exit_codes.AUTH_FAILED
        except RefusedError as exc:
            print(f"error: the coordinator refused: {exc}", file=sys.stderr)
            return exit_codes.REFUSED
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.UNREACHABLE

    return wrapper
