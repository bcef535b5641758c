"""``python -m coordinator`` is the ``shutdown-coordinator`` command."""

from __future__ import annotations

import sys

from coordinator.cli import main

if __name__ == "__main__":
    sys.exit(main())
