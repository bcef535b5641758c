"""The flags of the commands that talk to a running coordinator (``drain``, ``status``), and
the token they send."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from coordinator.settings import DEFAULT_URL, ENV_PREFIX


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token-file`` and ``--json``, their defaults from the environment."""
    parser.add_argument("--url", default=os.environ.get(ENV_PREFIX + "URL", DEFAULT_URL),
                        help=f"coordinator URL (default {DEFAULT_URL}) [env {ENV_PREFIX}URL]")
    parser.add_argument("--token-file", type=Path,
                        default=os.environ.get(ENV_PREFIX + "TOKEN_FILE") or None,
                        help=f"bearer token file [env {ENV_PREFIX}TOKEN_FILE, or "
                        f"{ENV_PREFIX}TOKEN]")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token: ``--token-file`` (or its variable) first, then ``..._TOKEN``."""
    if args.token_file is not None:
        return Path(args.token_file).read_text(encoding="utf-8").strip() or None
    return os.environ.get(ENV_PREFIX + "TOKEN") or None
