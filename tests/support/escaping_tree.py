"""A process tree whose processes escape it: ``python -m tests.support.escaping_tree DIR ...``.

Roles (``--role``):

- ``root`` (default): starts ``--children`` children, writes ``DIR/ready.json``
  ``{"pid", "children": [...], "daemons": [...]}`` once they run, then waits. On SIGTERM it
  writes ``DIR/root-<pid>.json``, waits for its children and exits 0. On SIGUSR1 it starts
  ``--late`` children, writes ``DIR/late.json`` ``{"pids": [...]}`` once they run, and crashes
  (exit 3, no cleanup): those children are reparented away from it.
- ``child``: with ``--daemon now`` it daemonizes (double fork and ``setsid``) before it reports
  ready; with ``--daemon on-term`` it does so when SIGTERM arrives, before its own cleanup;
  with ``--daemon orphan`` it double forks without ``setsid`` before it reports ready (the
  "daemon" is reparented away but stays in the root's session). Then, on SIGTERM, it writes
  ``DIR/child-<pid>.json`` and exits 0.
- ``late``: on SIGTERM writes ``DIR/late-<pid>.json`` and exits 0; with ``--late-setsid`` (given
  to the root) it first leaves the root's session and group (``setsid``).

A daemon writes ``DIR/daemon-<pid>.pid`` (``{"pid", "sid", "ppid", "start_ticks"}``) when it
is up and ``DIR/daemon-<pid>.json`` when SIGTERM ends it. Every process handles SIGTERM with
``sigwait`` (blocked from the start, inherited across ``fork``), so no signal is lost between
a fork and a handler.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def start_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


def daemonize(record_dir: Path, new_session: bool = True) -> int:
    """Double fork and ``setsid``; the daemon waits for SIGTERM. Returns the daemon's PID."""
    read_end, write_end = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(read_end)
        if new_session:
            os.setsid()
        if os.fork() == 0:
            run_daemon(record_dir, write_end)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        pid = int(pipe.readline())
    os.waitpid(intermediate, 0)
    return pid


def run_daemon(record_dir: Path, report_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    me = os.getpid()
    write_json(record_dir / f"daemon-{me}.pid", {"pid": me, "sid": os.getsid(0),
                                                 "ppid": os.getppid(),
                                                 "start_ticks": start_ticks(me)})
    os.write(report_fd, f"{me}\n".encode())
    os.close(report_fd)
    signal.sigwait({signal.SIGTERM})
    write_json(record_dir / f"daemon-{me}.json", {"pid": me})
    os._exit(0)


def spawn(record_dir: Path, role: str, *extra: str) -> tuple[subprocess.Popen[bytes], Any]:
    """Start a process of ``role`` and read its ready line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.escaping_tree", str(record_dir), "--role", role,
         *extra],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    return proc, json.loads(line)


def report_ready(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def run_root(args: argparse.Namespace) -> None:
    children = [spawn(args.dir, "child", "--daemon", args.daemon) for _ in range(args.children)]
    write_json(args.dir / "ready.json", {
        "pid": os.getpid(),
        "children": [info["pid"] for _, info in children],
        "daemons": [info["daemon"] for _, info in children if info["daemon"] is not None],
    })
    while True:
        sig = signal.sigwait({signal.SIGTERM, signal.SIGUSR1})
        if sig == signal.SIGUSR1:
            extra = ["--late-setsid"] if args.late_setsid else []
            late = [spawn(args.dir, "late", *extra) for _ in range(args.late)]
            write_json(args.dir / "late.json", {"pids": [info["pid"] for _, info in late]})
            os._exit(3)
        write_json(args.dir / f"root-{os.getpid()}.json", {"pid": os.getpid()})
        for proc, _ in children:
            proc.wait()
        sys.exit(0)


def run_child(args: argparse.Namespace) -> None:
    if args.late_setsid:
        os.setsid()
    daemon = None
    if args.daemon in ("now", "orphan"):
        daemon = daemonize(args.dir, new_session=args.daemon == "now")
    report_ready({"pid": os.getpid(), "daemon": daemon})
    signal.sigwait({signal.SIGTERM})
    if args.daemon == "on-term":
        daemon = daemonize(args.dir)
    write_json(args.dir / f"{args.role}-{os.getpid()}.json",
               {"pid": os.getpid(), "daemon": daemon})
    sys.exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--role", choices=("root", "child", "late"), default="root")
    parser.add_argument("--children", type=int, default=1)
    parser.add_argument("--daemon", choices=("none", "now", "on-term", "orphan"), default="none")
    parser.add_argument("--late", type=int, default=2)
    parser.add_argument("--late-setsid", action="store_true")
    parser.add_argument("--tag", default="", help="only shows in the command line")
    args = parser.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
    if args.role == "root":
        run_root(args)
    else:
        run_child(args)


if __name__ == "__main__":
    main()
