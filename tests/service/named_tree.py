"""A real process tree whose children are told apart by their command lines.

``python -m tests.service.named_tree --ready-file F --tag T NAME...`` starts one child per
NAME (``python -c ... tree-child-NAME``, sleeping, default SIGTERM disposition) and writes
``{"pid", "children": {NAME: pid}}`` to F once they run. On SIGTERM the root stops its own
children first (SIGTERM, then waits for them) and exits 0, the way SGLang's main process
tears its tree down.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.processes import ProcessJanitor, wait_for

CHILD = "import time\nwhile True: time.sleep(1000)"
ROOT_DIR = Path(__file__).resolve().parents[2]


def child_marker(name: str) -> str:
    """What a child's command line carries, for tier patterns."""
    return f"tree-child-{name}"


def start_named_tree(janitor: ProcessJanitor, tmp: Path, tag: str,
                     names: list[str]) -> dict[str, Any]:
    """Start the tree and return its ready document."""
    ready = tmp / f"{tag}.ready.json"
    janitor.spawn_python(
        ["-m", "tests.service.named_tree", "--ready-file", str(ready), "--tag", tag, *names],
        cwd=ROOT_DIR)
    text = wait_for(lambda: ready.exists() and ready.read_text(), what=f"tree {tag} ready")
    document: dict[str, Any] = json.loads(text)
    return document


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    children = {name: subprocess.Popen([sys.executable, "-c", CHILD, child_marker(name)])
                for name in args.names}
    tmp = args.ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(),
                               "children": {n: p.pid for n, p in children.items()}}))
    os.replace(tmp, args.ready_file)
    stop.wait()
    for proc in children.values():
        proc.terminate()
    for proc in children.values():
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
