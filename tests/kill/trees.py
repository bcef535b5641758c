"""A process tree to kill in tests: ``python -m tests.kill.trees SPEC_JSON RECORD_DIR``.

SPEC_JSON describes one node and, recursively, its children::

    {"role": "root", "teardown": 0.2, "exit_code": 0, "pdeathsig": false,
     "ignore_term": false, "fork_on_term": false, "children": [{...}, ...]}

Every node starts its children (``python -m tests.kill.trees CHILD_SPEC DIR``), waits for
their subtree to be up, then prints one JSON line ``[{"pid", "role", "depth"}, ...]`` for its
whole subtree on stdout. The top node writes the same list to ``DIR/ready.json``.

On SIGTERM a node runs its "cleanup" (sleeps ``teardown`` seconds), writes
``DIR/<role>-<pid>.json`` with ``cleanup_finished: true``, the times and ``reaped`` (the exit
code, ``-N`` for a signal, of each child it reaped, by PID: what its parent saw), and exits
with ``exit_code``. A node with ``pdeathsig`` asks the kernel to SIGKILL it when its parent dies,
so a parent killed before it ends its cleanup early (no marker); ``"pdeathsig": "SIGTERM"``
asks for that signal instead, so the node's cleanup runs when its parent dies (a child that
takes a moment to die after its parent, and says when in its marker). ``ignore_term`` ignores
SIGTERM; ``forks: N`` forks N plain children at start (cheap: no new interpreter);
``sigkill_self`` ends the node with its own SIGKILL after its cleanup (as stock SGLang's
``kill_process_tree(include_parent=True)`` does); ``fork_on_term`` forks a new process on
SIGTERM (which writes ``DIR/forked-<pid>.json`` at birth and behaves like a plain node).
Every node reaps its children as they exit, so their exit status is gone from ``waitid`` for
anyone else; one with ``reap: false`` leaves them zombies until its own SIGTERM.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def start_children(spec: dict[str, Any], record_dir: Path, depth: int) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.kill.trees", json.dumps(child), str(record_dir),
             str(depth + 1)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        for child in spec.get("children", [])
    ]
    subtree: list[dict[str, Any]] = []
    for proc in procs:
        assert proc.stdout is not None
        subtree += json.loads(proc.stdout.readline())
        proc.stdout.close()
    return subtree


REAPED: dict[int, int] = {}
"""Exit code (``Popen.returncode`` style: -N for a signal) of every child this node reaped."""


def reap_children() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        REAPED[pid] = os.waitstatus_to_exitcode(status)


def serve_until_term(spec: dict[str, Any], record_dir: Path, role: str) -> None:
    """Wait for SIGTERM while reaping children; then clean up and exit."""
    waited = {signal.SIGCHLD} if spec.get("ignore_term") else {signal.SIGTERM, signal.SIGCHLD}
    while True:
        sig = signal.sigwait(waited)
        if sig == signal.SIGCHLD:
            if spec.get("reap", True):
                reap_children()
            continue
        if spec.get("fork_on_term") and os.fork() == 0:
            run_forked(record_dir)
        signalled_at = time.time()
        time.sleep(float(spec.get("teardown", 0.0)))
        reap_children()
        write_json(
            record_dir / f"{role}-{os.getpid()}.json",
            {"pid": os.getpid(), "role": role, "cleanup_finished": True,
             "signalled_at": signalled_at, "ended_at": time.time(),
             "reaped": {str(pid): code for pid, code in REAPED.items()}},
        )
        if spec.get("sigkill_self"):
            # Stock SGLang's kill_process_tree(include_parent=True): cleanup, then SIGKILL.
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(int(spec.get("exit_code", 0)))


def run_forked(record_dir: Path) -> None:
    REAPED.clear()  # the parent's children are not this process's
    write_json(record_dir / f"forked-{os.getpid()}.json", {"pid": os.getpid()})
    serve_until_term({}, record_dir, "forked")


def main(argv: list[str]) -> None:
    spec: dict[str, Any] = json.loads(argv[0])
    record_dir = Path(argv[1])
    depth = int(argv[2]) if len(argv) > 2 else 0
    role = str(spec.get("role", "root" if depth == 0 else "child"))
    pdeathsig = spec.get("pdeathsig")
    if pdeathsig:
        set_pdeathsig(signal.Signals[pdeathsig] if isinstance(pdeathsig, str)
                      else signal.SIGKILL)
    if spec.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGCHLD})
    else:
        signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGTERM, signal.SIGCHLD})
    subtree = [{"pid": os.getpid(), "role": role, "depth": depth}]
    subtree += start_children(spec, record_dir, depth)
    for _ in range(int(spec.get("forks", 0))):
        # Cheap extra children (no new interpreter): each behaves like a plain node.
        pid = os.fork()
        if pid == 0:
            REAPED.clear()
            serve_until_term({}, record_dir, "fork")
        subtree.append({"pid": pid, "role": "fork", "depth": depth + 1})
    if depth == 0:
        write_json(record_dir / "ready.json", subtree)
    else:
        sys.stdout.write(json.dumps(subtree) + "\n")
        sys.stdout.flush()
    serve_until_term(spec, record_dir, role)


if __name__ == "__main__":
    main(sys.argv[1:])
