"""``python -m continuation_proxy``: run the proxy.

    python -m continuation_proxy --upstream http://127.0.0.1:30000 \\
        [--coordinator URL ...] [--coordinators-dns NAME:PORT ...] [--token-file FILE] \\
        [--host 127.0.0.1] [--port 0] [--ready-file FILE]

Once listening it writes ``{"pid", "port", "url"}`` to the ready file (atomically) and prints
it on one line. SIGTERM or SIGINT stop it: it stops accepting, gives open streams
``--shutdown-timeout`` seconds to end, and exits 0; a second SIGINT stops it at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from continuation_proxy import discovery
from continuation_proxy.app import build_app
from continuation_proxy.bodies import MAX_BODY_BYTES, Limits
from router_client import ContinuingClient
from router_client.continuation import MAX_CONTINUATIONS

DNS_INTERVAL_S = discovery.DNS_INTERVAL_S

EXIT_OK = 0
EXIT_USAGE = 2
"""argparse's code for a command line it refuses; also an unreadable or empty token file."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SHUTDOWN_TIMEOUT_S = 10.0
"""How long open streams may run on after a stop signal (s) before they are cut."""
TOKEN_ENV = "SHUTDOWN_COORDINATOR_TOKEN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m continuation_proxy",
        description="Continue handed-back streams through an OpenAI-compatible router.")
    parser.add_argument("--upstream", required=True, metavar="URL",
                        help="the router (or engine) every request goes to")
    parser.add_argument("--coordinator", action="append", default=[], metavar="URL",
                        help="a coordinator to acknowledge handoffs to (repeatable)")
    parser.add_argument("--coordinators-dns", action="append", default=[], metavar="NAME:PORT",
                        type=_dns_name,
                        help="acknowledge to every address of NAME (a headless Service of the "
                        "pods' coordinators), looked up again every --dns-interval (repeatable)")
    parser.add_argument("--dns-interval", type=float, default=DNS_INTERVAL_S, metavar="S",
                        help=f"seconds between two lookups (default {DNS_INTERVAL_S:g})")
    parser.add_argument("--token-file", metavar="FILE",
                        help=f"the coordinators' bearer token (else ${TOKEN_ENV})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--ready-file", metavar="FILE",
                        help="write {pid, port, url} here once listening")
    parser.add_argument("--max-continuations", type=int, default=MAX_CONTINUATIONS)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    parser.add_argument("--no-token-ids", dest="token_ids", action="store_false",
                        help="never ask completions for token ids (continue by text)")
    parser.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if not args.upstream.startswith(("http://", "https://")):
        parser.error("--upstream must be an http:// or https:// URL")
    if args.max_continuations < 0 or args.max_body_bytes <= 0:
        parser.error("--max-continuations must be >= 0 and --max-body-bytes > 0")
    if not args.dns_interval > 0:
        parser.error("--dns-interval must be > 0")
    return args


def _dns_name(text: str) -> tuple[str, int]:
    try:
        return discovery.parse_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def read_token(path: str | None) -> str | None:
    """The token from ``path`` (stripped), else the environment's; SystemExit(2) for a file
    that cannot be read or is empty: a proxy whose acks are refused would lose them."""
    if path is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--token-file {path}: cannot read it: {exc}") from None
    if not token:
        raise SystemExit(f"--token-file {path}: it is empty")
    return token


async def serve(args: argparse.Namespace) -> None:
    """1. Bind the socket (port 0: the kernel picks) and listen, so connections queue
       before uvicorn accepts.
    2. Write the ready file, print the same line.
    3. Serve until a stop signal; then close the clients."""
    token = read_token(args.token_file)
    client = ContinuingClient(args.upstream, coordinators=args.coordinator, token=token,
                              max_continuations=args.max_continuations,
                              ask_token_ids=args.token_ids)
    app = build_app(client, Limits(max_body_bytes=args.max_body_bytes))
    sock, url = _listen(args.host, args.port)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, lifespan="off",
                                           timeout_graceful_shutdown=args.shutdown_timeout))
    _stop_on_signals(server)
    dns = (asyncio.get_running_loop().create_task(discovery.follow(
        args.coordinators_dns, client.acks.discovered, args.dns_interval))
        if args.coordinators_dns else None)
    _announce(url, args.ready_file)
    try:
        await server.serve(sockets=[sock])
    finally:
        if dns is not None:
            dns.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dns
        await client.aclose()


def _listen(host: str, port: int) -> tuple[socket.socket, str]:
    """A socket listening on ``host:port`` (connections queue from now on, before uvicorn
    accepts them), and its URL."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown}:{sock.getsockname()[1]}"


def _announce(url: str, ready_file: str | None) -> None:
    """Say where the proxy listens: one JSON line on stdout, and the ready file (written
    whole under another name, then renamed, so a reader never sees half of it)."""
    line = json.dumps({"pid": os.getpid(), "port": int(url.rsplit(":", 1)[1]), "url": url})
    if ready_file:
        partial = Path(f"{ready_file}.partial")
        partial.write_text(line, encoding="utf-8")
        partial.replace(ready_file)
    print(line, flush=True)


def _stop_on_signals(server: uvicorn.Server) -> None:
    """SIGTERM and SIGINT ask ``server`` to stop, before uvicorn takes them over and after
    it gives them back. uvicorn raises the signal it stopped on again once it has stopped,
    with the handlers it found restored: these, so the proxy then exits 0 instead of dying
    by the signal, and a signal during start-up is not lost. Handlers only record."""

    def stop(sig: int, frame: FrameType | None) -> None:
        server.should_exit = True

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency on Linux): every token the
    proxy carries is a socket read and a socket write, which uvloop does in C; asyncio's own
    loop elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(args))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return EXIT_USAGE
        raise
    return EXIT_OK
