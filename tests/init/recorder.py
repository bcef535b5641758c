"""A process that writes down every signal it receives: ``python -m tests.init.recorder DIR
[--child]``.

It takes every signal an init may pass on (blocked, then ``sigwaitinfo``), appends each
one's name to its record ``DIR/<role>-<pid>.json`` (``{"pid", "ppid", "pgid", "sid",
"signals", "exit_code"}``, rewritten whole at each change) and exits 0 on SIGTERM, after
writing ``exit_code: 0``.
With ``--child`` it first starts a child of its own (role ``child``, same session and
process group, the same program), waits for it to be up, and on SIGTERM waits for it to end
before it exits. The top process writes ``DIR/ready.json`` (``{"main", "child"}``) once both
are up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RECORDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGWINCH, signal.SIGALRM, signal.SIGCONT, signal.SIGTERM)


def write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    role = "child" if "--role-child" in argv else "main"
    path = directory / f"{role}-{os.getpid()}.json"
    record: dict[str, Any] = {"pid": os.getpid(), "ppid": os.getppid(),
                              "pgid": os.getpgid(0), "sid": os.getsid(0), "signals": [],
                              "exit_code": None}
    signal.pthread_sigmask(signal.SIG_BLOCK, RECORDED)  # taken by sigwaitinfo, one by one
    write(path, record)
    child = None
    if "--child" in argv:
        child = subprocess.Popen([sys.executable, "-m", "tests.init.recorder", str(directory),
                                  "--role-child"])
        while not (directory / f"child-{child.pid}.json").exists():
            time.sleep(0.01)
        write(directory / "ready.json", {"main": os.getpid(), "child": child.pid})
    elif role == "main":
        write(directory / "ready.json", {"main": os.getpid(), "child": None})
    while True:
        sig = signal.sigwaitinfo(RECORDED).si_signo
        record["signals"].append(signal.Signals(sig).name)
        write(path, record)
        if sig == signal.SIGTERM:
            if child is not None:
                child.wait()
            record["exit_code"] = 0
            write(path, record)
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
