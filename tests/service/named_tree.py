"""A real process tree whose children are told apart by their command lines, and whose every
process records how it ended.

``python -m tests.service.named_tree --ready-file F --record-dir D --tag T NAME...`` starts
one child per NAME (``python -c ... tree-child-NAME``, sleeping) and writes
``{"pid", "children": {NAME: pid}}`` to F once each of them waits for SIGTERM.

Every process waits for SIGTERM with ``sigwaitinfo``, so it learns who sent it, and writes
``D/<role>-<pid>.json`` (``{"pid", "role", "sender", "signalled_at"}``) at once. A child
then dies of SIGTERM's default action (no cleanup, as a process without a handler does). The
root stops its own children first (SIGTERM, then waits for them, so they stay zombies until
then), adds the exit code it saw for each (``"children": {NAME: {"pid", "exit_code"}}``,
-15 for SIGTERM) to its record, and exits 0, the way SGLang's main process tears its tree
down. The record directory reaches the children through the environment, so no child's
command line names anything but its marker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import ProcessJanitor, wait_for

RECORDS_ENV = "NAMED_TREE_RECORDS"
CHILD = f"""\
import json, os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
sys.stdout.write("up\\n")
sys.stdout.close()
info = signal.sigwaitinfo({{signal.SIGTERM}})
path = os.path.join(os.environ[{RECORDS_ENV!r}], f"child-{{os.getpid()}}.json")
with open(path + ".tmp", "w") as f:
    json.dump({{"pid": os.getpid(), "role": "child", "sender": info.si_pid,
               "signalled_at": time.time()}}, f)
os.replace(path + ".tmp", path)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
os.kill(os.getpid(), signal.SIGTERM)
"""
ROOT_DIR = Path(__file__).resolve().parents[2]


def child_marker(name: str) -> str:
    """What a child's command line carries, for tier patterns."""
    return f"tree-child-{name}"


@dataclass
class NamedTree:
    """A running named tree."""

    root: subprocess.Popen[Any]
    record_dir: Path
    children: dict[str, int]
    """PID of each child, by name."""

    @property
    def pid(self) -> int:
        return self.root.pid

    def records(self) -> dict[int, dict[str, Any]]:
        """What each process that got SIGTERM recorded, by PID."""
        out: dict[int, dict[str, Any]] = {}
        for path in self.record_dir.glob("*-*.json"):
            data: dict[str, Any] = json.loads(path.read_text())
            out[int(data["pid"])] = data
        return out


def start_named_tree(janitor: ProcessJanitor, tmp: Path, tag: str,
                     names: list[str]) -> NamedTree:
    """Start the tree and wait until every child runs."""
    ready = tmp / f"{tag}.ready.json"
    record_dir = tmp / f"{tag}.records"
    record_dir.mkdir()
    root = janitor.spawn_python(
        ["-m", "tests.service.named_tree", "--ready-file", str(ready), "--record-dir",
         str(record_dir), "--tag", tag, *names], cwd=ROOT_DIR)
    text = wait_for(lambda: ready.exists() and ready.read_text(), what=f"tree {tag} ready")
    document: dict[str, Any] = json.loads(text)
    assert document["pid"] == root.pid
    return NamedTree(root, record_dir, {n: int(p) for n, p in document["children"].items()})


def write_record(record_dir: Path, data: dict[str, Any]) -> None:
    path = record_dir / f"{data['role']}-{data['pid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--record-dir", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    env = {**os.environ, RECORDS_ENV: str(args.record_dir)}
    children = {name: subprocess.Popen([sys.executable, "-c", CHILD, child_marker(name)],
                                       env=env, stdout=subprocess.PIPE)
                for name in args.names}
    for proc in children.values():
        # The child says so once SIGTERM is blocked: from then on it cannot miss the signal.
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"
        proc.stdout.close()
    tmp = args.ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(),
                               "children": {n: p.pid for n, p in children.items()}}))
    os.replace(tmp, args.ready_file)
    info = signal.sigwaitinfo({signal.SIGTERM})
    record: dict[str, Any] = {"pid": os.getpid(), "role": "root", "sender": info.si_pid,
                              "signalled_at": time.time()}
    write_record(args.record_dir, record)
    for proc in children.values():
        proc.terminate()
    record["children"] = {n: {"pid": p.pid, "exit_code": p.wait()} for n, p in children.items()}
    write_record(args.record_dir, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
