"""preStop hook: drain the pod through its shutdown-coordinator and wait until it is done.

The kubelet's ``httpGet`` hook can only send literal header values, so a token kept in a
Secret cannot reach it. This hook runs instead (``exec``, inside the engine container): it
reads the token from the mounted Secret, sends ``GET /drain`` with ``Authorization: Bearer``
and blocks until the coordinator answers with the drain's summary. The kubelet sends SIGTERM
to the container only after the hook returns, and bounds the hook by the pod's grace period.

Standard library only, so it runs with whatever ``python3`` the engine image has.

Settings (flags win over the environment):

    --url         SHUTDOWN_COORDINATOR_URL         default http://127.0.0.1:8787
    --token-file  SHUTDOWN_COORDINATOR_TOKEN_FILE  default: no token
    --timeout     seconds to wait for the summary  default: none (the kubelet bounds it)
    --main-by-kubelet                              return when the drain reaches the
                  engine's main process, and leave its SIGTERM to the kubelet

``--main-by-kubelet`` (the engine container's hook in the shipped manifests): the hook runs
inside the engine container, and on containerd the end of that container's main process
SIGKILLs it (exit 137, a spurious ``FailedPreStopHook`` event). With this flag the coordinator
answers once everything but the main processes is done (``GET /drain?main=caller``), the
hook returns, and the kubelet's own SIGTERM, sent when the hook returns, stops the main
process; the coordinator waits for it and SIGKILLs it if it outlives its tier. The exit code
then covers the processes stopped so far; the drain's final outcome is in the coordinator's
log (``drain end:``) and ``/status``. The main process must be the container's own (an
exec-form command), or a process it passes SIGTERM on to.

Exit codes are those of ``shutdown-coordinator drain``; the kubelet shows a failed hook's
output in a ``FailedPreStopHook`` event, so the one summary line printed is what an operator
sees in ``kubectl describe pod``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any

OK = 0
KILLED = 3
SURVIVED = 4
ABORTED = 5
UNREACHABLE = 6
AUTH_FAILED = 7
REFUSED = 8
SIGNALLED = 9
FAILED = 10
LOST_REQUESTS = 11
ERROR = 12
UNVERIFIED = 13
NOTHING_TO_DRAIN = 14

OUTCOME_CODES = {
    "graceful": OK,
    "survived": SURVIVED,
    "killed": KILLED,
    "signalled": SIGNALLED,
    "failed": FAILED,
    "lost_requests": LOST_REQUESTS,
    "error": ERROR,
    "unverified": UNVERIFIED,
    "nothing_to_drain": NOTHING_TO_DRAIN,
    "aborted": ABORTED,
    "timeout": SURVIVED,
}

DEFAULT_URL = "http://127.0.0.1:8787"
CONNECT_RETRY_S = 10.0
"""Seconds to keep retrying a refused connection: a coordinator container that is being
restarted comes back within this, and its state file resumes any drain in progress."""
RETRY_INTERVAL_S = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SHUTDOWN_COORDINATOR_URL", DEFAULT_URL))
    parser.add_argument(
        "--token-file", default=os.environ.get("SHUTDOWN_COORDINATOR_TOKEN_FILE") or None
    )
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--connect-retry", type=float, default=CONNECT_RETRY_S)
    parser.add_argument("--main-by-kubelet", action="store_true")
    return parser.parse_args(argv)


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip() or None


def request_drain(url: str, token: str | None, timeout: float | None,
                  main_by_caller: bool = False) -> tuple[int, bytes]:
    """GET /drain; the HTTP status and body (error statuses included)."""
    path = "/drain?main=caller" if main_by_caller else "/drain"
    request = urllib.request.Request(url.rstrip("/") + path, method="GET")
    request.add_header("Accept", "application/json")
    if token:
        # http.client writes headers as latin-1: these are the token's UTF-8 bytes.
        request.add_header("Authorization", f"Bearer {token}".encode().decode("latin-1"))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def outcome_code(summary: dict[str, Any]) -> int:
    """The exit code for a drain summary: its ``outcome``, else the processes' fates (at a
    handover, of the processes stopped so far: the main processes and what comes after them
    are still running)."""
    if isinstance(summary.get("main_left_to_caller"), list):
        outcome = summary.get("outcome_so_far")
    else:
        outcome = summary.get("outcome")
    if isinstance(outcome, str) and outcome in OUTCOME_CODES:
        return OUTCOME_CODES[outcome]
    if summary.get("phase") == "serving":
        return ABORTED
    fates = [p.get("fate") for p in summary.get("processes") or [] if isinstance(p, dict)]
    if "survived" in fates or "running" in fates:
        return SURVIVED
    if "killed" in fates:
        return KILLED
    return OK


def describe(summary: dict[str, Any]) -> str:
    """One line: phase, outcome, the count of each fate, every process that needed SIGKILL,
    and the causes the coordinator named for a drain that was not graceful."""
    processes = [p for p in summary.get("processes") or [] if isinstance(p, dict)]
    counts: dict[str, int] = {}
    for proc in processes:
        fate = str(proc.get("fate"))
        counts[fate] = counts.get(fate, 0) + 1
    parts = [f"phase={summary.get('phase')}"]
    handed = summary.get("main_left_to_caller")
    if isinstance(handed, list):
        names = {p.get("pid"): p.get("name") for p in processes}
        parts.append("main left to the kubelet's SIGTERM: "
                     + " ".join(f"{pid}({names.get(pid)})" for pid in handed))
    if summary.get("outcome") is not None:
        parts.append(f"outcome={summary.get('outcome')}")
    if isinstance(handed, list) and summary.get("outcome_so_far") is not None:
        parts.append(f"so far={summary.get('outcome_so_far')}")
    parts.extend(f"{fate}={n}" for fate, n in sorted(counts.items()))
    # At a handover the main processes (and what comes after them) still run, as planned.
    unsettled = () if isinstance(handed, list) else ("running",)
    hard = [
        f"{p.get('pid')}({p.get('name')}):{p.get('fate')}"
        for p in processes
        if p.get("fate") in ("killed", "survived", *unsettled)
    ]
    if hard:
        parts.append("not graceful: " + " ".join(hard))
    drain = summary.get("drain") or summary.get("last_drain") or {}
    causes = drain.get("causes") if isinstance(drain, dict) else None
    if isinstance(handed, list):
        causes = summary.get("causes_so_far")
    if isinstance(causes, list) and causes:
        parts.append("causes: " + " | ".join(str(c) for c in causes))
    return "drain " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        token = read_token(args.token_file)
    except OSError as exc:
        print(f"drain hook: cannot read token file: {exc}", flush=True)
        return AUTH_FAILED
    give_up_at: float | None = None
    while True:
        try:
            status, body = request_drain(args.url, token, args.timeout, args.main_by_kubelet)
            break
        # socket.timeout is only an alias of TimeoutError from Python 3.10 on; engine
        # images may ship an older python3.
        except (TimeoutError, socket.timeout):  # noqa: UP041
            print(f"drain hook: no summary from {args.url} within {args.timeout}s", flush=True)
            return UNREACHABLE
        except OSError as exc:
            # Refused or reset: the coordinator may be restarting. Asking again joins the
            # same drain (the restarted coordinator resumes it from its state file).
            now = time.monotonic()
            if give_up_at is None:
                give_up_at = now + max(0.0, args.connect_retry)
            if now >= give_up_at:
                print(f"drain hook: coordinator at {args.url} unreachable: {exc}", flush=True)
                return UNREACHABLE
            time.sleep(RETRY_INTERVAL_S)
    if status in (401, 403):
        print(f"drain hook: token refused (HTTP {status})", flush=True)
        return AUTH_FAILED
    if 400 <= status < 500:
        print(f"drain hook: drain refused (HTTP {status}): {body[:300]!r}", flush=True)
        return REFUSED
    try:
        summary = json.loads(body)
    except ValueError:
        summary = None
    if status != 200 or not isinstance(summary, dict):
        print(f"drain hook: unexpected answer (HTTP {status}): {body[:300]!r}", flush=True)
        return UNREACHABLE
    print(describe(summary), flush=True)
    return outcome_code(summary)


if __name__ == "__main__":
    sys.exit(main())
