"""The flags of the commands that talk to a running coordinator (``drain``, ``status``), and
the token they send."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from coordinator.settings import DEFAULT_URL, ENV_PREFIX


class TokenFileError(OSError):
    """The token file cannot be read; the message names the flag (or variable) that gave it."""


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token-file`` and ``--json``; the first two default to their variables."""
    parser.add_argument("--url", default=_default_url(),
                        help=f"coordinator URL (default {DEFAULT_URL}) [env {ENV_PREFIX}URL]")
    parser.add_argument("--token-file", type=Path, default=None,
                        help=f"bearer token file [env {ENV_PREFIX}TOKEN_FILE, or the token "
                        f"itself in {ENV_PREFIX}TOKEN]")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _default_url() -> str:
    return os.environ.get(ENV_PREFIX + "URL") or DEFAULT_URL


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token: ``--token-file`` (or its variable) first, then ``..._TOKEN``;
    ``TokenFileError`` naming where the file came from when it cannot be read."""
    path, source = args.token_file, "--token-file"
    if path is None and os.environ.get(ENV_PREFIX + "TOKEN_FILE"):
        path, source = Path(os.environ[ENV_PREFIX + "TOKEN_FILE"]), ENV_PREFIX + "TOKEN_FILE"
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise TokenFileError(f"{source} {path}: cannot read the token: {why}") from exc
    return os.environ.get(ENV_PREFIX + "TOKEN") or None


def same_coordinator(args: argparse.Namespace) -> str:
    """The flags another command needs to reach the same coordinator the same way (`` --url
    U --token-file F``, each only when this command line gave it)."""
    flags = []
    if args.url != _default_url():
        flags += ["--url", args.url]
    if args.token_file is not None:
        flags += ["--token-file", str(args.token_file)]
    return "".join(" " + shlex.quote(f) for f in flags)
