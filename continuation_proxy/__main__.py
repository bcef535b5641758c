"""``python -m continuation_proxy``: see continuation_proxy.cli."""

import sys

from continuation_proxy.cli import main

sys.exit(main())
