"""Small real process trees for the service tests, and the helpers that start them.

``python -m tests.service.trees --ready-file F [--children N] [--grandchildren M]
[--stubborn K] [--tag T]`` starts a root (this script) with N ``sh`` children, each running
M ``sleep`` grandchildren, plus K children that ignore SIGTERM; it writes
``{"pid", "children": [...], "all": [...]}`` to F once everything runs, and exits 0 on
SIGTERM after its children are gone. ``--tag`` only shows up in the command line, for
adoption by pattern.
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

import psutil

from tests.support.processes import ProcessJanitor, wait_for

STUBBORN = "trap '' TERM; exec sleep 1000"


def start_tree(janitor: ProcessJanitor, tmp: Path, *, children: int = 2,
               grandchildren: int = 1, stubborn: int = 0, tag: str = "tree",
               ) -> dict[str, Any]:
    """Start a tree in its own session and return its ready document."""
    ready = tmp / f"{tag}-{len(list(tmp.iterdir()))}.ready.json"
    janitor.spawn_python(
        ["-m", "tests.service.trees", "--ready-file", str(ready), "--children", str(children),
         "--grandchildren", str(grandchildren), "--stubborn", str(stubborn), "--tag", tag],
        cwd=Path(__file__).resolve().parents[2])
    text = wait_for(lambda: ready.exists() and ready.read_text(), what=f"tree {tag} ready")
    document: dict[str, Any] = json.loads(text)
    return document


def start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--grandchildren", type=int, default=1)
    parser.add_argument("--stubborn", type=int, default=0)
    parser.add_argument("--tag", default="tree")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    script = "sleep 1000 & " * args.grandchildren + "wait"
    procs = [subprocess.Popen(["sh", "-c", script]) for _ in range(args.children)]
    procs += [subprocess.Popen(["sh", "-c", STUBBORN]) for _ in range(args.stubborn)]
    expected = args.children * (1 + args.grandchildren) + args.stubborn
    me = psutil.Process()
    for _ in range(3000):
        if len(me.children(recursive=True)) >= expected or stop.is_set():
            break
        stop.wait(0.01)
    everything = [p.pid for p in me.children(recursive=True)]
    tmp = args.ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "children": [p.pid for p in procs],
                               "all": [os.getpid(), *everything]}))
    os.replace(tmp, args.ready_file)
    stop.wait()
    for proc in procs:
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
