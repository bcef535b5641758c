"""``shutdown-coordinator``: ``serve``, ``drain``, ``status`` and ``kill``.

Every ``serve`` flag also reads ``SHUTDOWN_COORDINATOR_<NAME>`` (see ``coordinator.settings``);
the client commands read ``SHUTDOWN_COORDINATOR_URL`` and ``SHUTDOWN_COORDINATOR_TOKEN_FILE``
(or ``SHUTDOWN_COORDINATOR_TOKEN``). Exit codes are in ``coordinator.exit_codes``.

One module per command (``serve``, ``drain``, ``status``, ``kill``), each with
``add_parser(sub)`` and ``run(args) -> int``; ``entry`` assembles the parser and dispatches;
``client_flags`` and ``client_errors`` are what ``drain`` and ``status`` share. A command
reaches the service only through its public pieces: the HTTP client
(``coordinator.service.client``), the text renderers (``coordinator.service.render``), and for
``serve`` the security check and the server start (``posture.check``, ``server.serve``).
Whatever a command needs beyond the standard library and the parser is imported when it runs,
so ``status`` and ``drain`` (the preStop hook's path) never load FastAPI, uvicorn or psutil.

The demo is a command of its own, ``shutdown-coordinator-demo`` (``devstack.demo``), which no
module of the product imports; ``shutdown-coordinator demo`` only says so (``DEMO_MOVED``).
"""

from coordinator.cli.entry import DEMO_MOVED, build_parser, main

__all__ = ["DEMO_MOVED", "build_parser", "main"]
