"""A small container program for the pod runner's own tests: it records what happens to it.

    python3 toy.py NAME RECORDS_DIR [--serve PORT] [--on-term exit:N|ignore|linger:S]
                                    [--facts]

Appends one JSON line per event to ``RECORDS_DIR/NAME.jsonl``: ``start`` (pid in its
namespace, uid, gid, groups, time), each ``signal`` it gets (and what it does about it),
each HTTP ``request`` it serves (path, headers), and ``exit`` (code). With ``--facts`` it
also writes ``RECORDS_DIR/NAME-facts.json``: its environment, capabilities, NoNewPrivs,
whether ``/`` is writable, and the files, modes and mounts it sees. With ``--serve PORT`` it
serves HTTP on every address: ``GET /ready`` answers 200 once ``RECORDS_DIR/NAME.ready``
exists (503 before), anything else 200, or the status given as ``?status=N``.

On SIGTERM: ``exit:N`` (the default, ``exit:0``) exits N at once; ``ignore`` records it
and carries on; ``linger:S`` exits 0 after S seconds. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


class Recorder:
    def __init__(self, records: Path, name: str) -> None:
        self.path = records / f"{name}.jsonl"
        self.lock = threading.Lock()

    def __call__(self, event: str, **data: object) -> None:
        line = json.dumps({"event": event, "at": time.time(), **data})
        with self.lock, self.path.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())


def facts(path: Path) -> None:
    status = Path("/proc/self/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
    try:
        Path("/root-write-test").write_text("x")
        writable = True
    except OSError:
        writable = False
    files = {}
    for top in ("/etc/config", "/etc/secret", "/data", "/scratch", "/dev/shm"):
        for root, _, names in os.walk(top):
            for entry in [root, *(os.path.join(root, n) for n in names)]:
                st = os.stat(entry)
                files[entry] = {"mode": f"{st.st_mode & 0o7777:o}", "uid": st.st_uid,
                                "gid": st.st_gid}
    mounts = {line.split()[1]: line.split()[2] for line in
              Path("/proc/self/mounts").read_text().splitlines()}
    sizes = {m: os.statvfs(m).f_blocks * os.statvfs(m).f_frsize
             for m in ("/data", "/dev/shm") if m in mounts}
    path.write_text(json.dumps({
        "env": dict(os.environ), "uid": os.getuid(), "gid": os.getgid(),
        "groups": sorted(os.getgroups()), "cap_eff": fields["CapEff"].strip(),
        "no_new_privs": fields.get("NoNewPrivs", "").strip(), "root_writable": writable,
        "files": files, "mounts": mounts, "sizes": sizes, "hostname": os.uname().nodename,
        "argv": sys.argv}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("records", type=Path)
    parser.add_argument("--serve", type=int)
    parser.add_argument("--on-term", default="exit:0")
    parser.add_argument("--facts", action="store_true")
    args, rest = parser.parse_known_args()
    record = Recorder(args.records, args.name)
    done = threading.Event()
    exit_code = [0]
    action, _, value = args.on_term.partition(":")

    def on_term(signum: int, _frame: object) -> None:
        record("signal", signal=signal.Signals(signum).name, action=args.on_term)
        if action == "exit":
            exit_code[0] = int(value)
            done.set()
        elif action == "linger":
            threading.Timer(float(value), done.set).start()

    signal.signal(signal.SIGTERM, on_term)
    record("start", pid=os.getpid(), uid=os.getuid(), gid=os.getgid(),
           groups=sorted(os.getgroups()), extra=rest)
    if args.facts:
        facts(args.records / f"{args.name}-facts.json")
    if args.serve:
        ready_flag = args.records / f"{args.name}.ready"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                record("request", path=url.path, headers=dict(self.headers))
                if url.path == "/ready":
                    status = 200 if ready_flag.exists() else 503
                else:
                    status = int(parse_qs(url.query).get("status", ["200"])[0])
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        server = ThreadingHTTPServer(("0.0.0.0", args.serve), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    done.wait()
    record("exit", code=exit_code[0])
    return exit_code[0]


if __name__ == "__main__":
    sys.exit(main())
