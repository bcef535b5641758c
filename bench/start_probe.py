"""One coordinator start, in one process, ended at the first 200 of the given requests.

    python bench/start_probe.py PORT_FILE PATH[,PATH...] [SERVE_FLAGS...]

Run by ``bench.start_cost --instructions`` under callgrind, with each side's own interpreter
(its ``coordinator`` is the one that interpreter installed): the main thread runs
``shutdown-coordinator serve`` as the command line does; a thread waits for the port file
(a look every 100 ms: a few million instructions at most), asks each path in turn, and ends
the process with ``os._exit`` at the last 200, so what is counted is the start to that
answer. Exits 3 when a path after the first does not answer 200.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path


def answers(port: int, path: str) -> bool:
    """Whether ``GET path`` answers 200 (read to its end, so the server did all its work)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Connection: close\r\n\r\n".encode())
            head = sock.recv(65536)
            while sock.recv(65536):
                pass
            return head.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def ask(port_file: Path, paths: list[str]) -> None:
    while True:
        try:
            port = int(json.loads(port_file.read_text())["port"])
            break
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    for i, path in enumerate(paths):
        while not answers(port, path):
            if i:
                os._exit(3)
            time.sleep(0.1)
    os._exit(0)


def main() -> None:
    port_file, paths, flags = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
    port_file.unlink(missing_ok=True)
    threading.Thread(target=ask, args=(port_file, paths), daemon=True).start()
    from coordinator.cli import main as cli

    sys.exit(cli(["serve", "--port", "0", "--port-file", str(port_file), "--log-level",
                  "warning", *flags]))


if __name__ == "__main__":
    main()
