"""Before and after the ``dynamo`` profile, on Dynamo's own worker runtime: how each way of
stopping a worker pod ends the worker and the streams in flight on it.

    .venv/bin/python -m bench.engine_profiles_dynamo [--streams 3] [--tokens 1500]

Needs the ai-dynamo of ``scripts/engines.sh dynamo`` and ``kubectl`` (the ``dynamo-worker``
overlay is rendered). The worker is run as ``tests/engines/test_overlays_dynamo.py`` runs it:
the overlay's engine command with ``dynamo.vllm`` → ``dynamo.mocker`` (Dynamo's Rust worker
runtime around a simulated engine, one process; the tiny model, the test's pacing
``--speedup-ratio``), the overlay's ``DYN_*`` env with file discovery, loopback planes and a
free system port; Dynamo's frontend with ``--migration-limit 3``. Each row starts a fresh
frontend and worker, opens ``--streams`` streams of ``--tokens`` tokens through the frontend
(each chunk names the worker that produced it), waits for each stream's first chunks, then
stops the worker one way:

- ``kubelet, no sidecar``: SIGTERM to the worker, what the kubelet sends without the
  coordinator (before the profiles, the overlay's coordinator adopted nothing, so the pod got
  exactly this);
- ``generic profile``: the coordinator adopts the worker by pattern with ``--engine generic``
  (no in-flight probe; the default order, the root's SIGTERM bounded by the tier timeout),
  drained by the plain hook (``GET /drain``, it waits for the drain's end);
- ``dynamo profile (the overlay)``: the coordinator with the overlay's rendered settings
  (``--engine dynamo``: no engine metrics URL, so no in-flight probe; the worker's root alone
  in a 60 s tier), drained by the rendered preStop command (``--main-by-kubelet``), then the
  kubelet's SIGTERM to the worker once the hook returned.

Both coordinators run with the overlay's rendered ConfigMap (grace period, safety margin,
min-drain: the same budget; neither has an engine metrics URL), ``generic`` with only the
engine changed and an adopt pattern added, so that the two rows differ by the profile alone;
both are confined to the worker's PID (``SHUTDOWN_COORDINATOR_CONFINE_TO_PID``), which stands
in for the pod's PID namespace: on this machine the coordinator would otherwise also see the
second worker below. In every row the kubelet's deadline is the rendered grace period from the
stop: a worker still running then is SIGKILLed (counted, as the kubelet's).

A second, plain worker (the same command, no coordinator) is started once the streams are in
flight on the first, and the frontend has routed a request to it before the stop. Chosen so
that a migration has somewhere to go: with one worker, a stream the frontend migrates off the
stopped worker has no other worker and fails, which would count a migration as a cut stream
and hide what the frontend's ``--migration-limit`` does; a pod is drained beside other
replicas in a cluster. Starting it after the streams keeps every stream on the worker being
stopped (the frontend routes round-robin).

``--tokens 1500`` (three streams take about 37 s here at the test's pace) keeps the streams
running past the generic drain's SIGTERM and its tier timeout (min-drain 5 s + 10 s) and
ends them within the dynamo profile's 60 s root tier.

Each row is read from ground truth: the worker's wait status; the coordinator's outcome and
each process's fate (``GET /drain``); the streams as the client received them (whole:
``[DONE]`` with every token) and as the frontend's log tells them, by each stream's
``x-request-id``: the workers it was routed to (``Selected worker``) and its migrations
(``migration retry scheduled``, with the worker it left and the tokens done by then; the
chunks' ``nvext.worker_id`` keeps naming the first worker after a migration, so it is shown
but not used); the worker's own log lines about its shutdown; the seconds from the stop (the
signal, or the hook's start) to the worker's exit. And where new traffic goes meanwhile,
each short request through the frontend answered with the worker that served it: four from
2 s after the stop, and two more once the worker has logged its shutdown signal (its SIGTERM,
whoever sent it), while it still waits for the streams.

Steps:
    1. render the overlay, write the tiny model;
    2. per row: start the frontend and the worker, the coordinator (rows 2-3); open the
       streams; start the second worker and wait until the frontend routes to it; stop the
       first the row's way (four short requests from 2 s later, two once it logged its
       SIGTERM); wait for its exit, for the streams' end and for the drain's summary;
       anything of its tree still there 30 s after it is SIGKILLed and counted;
    3. print one table and each row's details.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.dynamo_observed import (
    AFTER_SIGTERM_REQUESTS,
    ERROR,
    MIGRATION,
    NEW_AT_S,
    NEW_REQUESTS,
    RETRY,
    SETTLE_S,
    TIMEOUTS,
    UNREGISTER,
    WAITING,
    WORKER_LINES,
    Row,
    Stream,
    short,
    status_text,
)
from tests.deploy.rendering import DRAIN_HOOK, Rendered
from tests.engines.stack import (
    DYNAMO_START_S,
    ROOT,
    http_ok,
    pattern_for,
    spawn_logged,
    tree,
    wait_http,
)
from tests.engines.test_overlays import hook_command, rendered, start_coordinator_with
from tests.engines.test_overlays_dynamo import (
    GRACEFUL,
    plain,
    served_by,
    start_frontend,
    worker_command,
    worker_env,
)
from tests.engines.tiny_model import write_tiny_model
from tests.support.processes import ProcessJanitor, wait_for

ROWS = (
    ("kubelet, no sidecar", "kubelet"),
    ("generic profile", "generic"),
    ("dynamo profile (the overlay)", "dynamo"),
)


def run_row(name: str, mode: str, pod: Rendered, janitor: ProcessJanitor, tmp: Path,
            model: Path, streams: int, tokens: int) -> Row:
    row = Row(name)
    tmp.mkdir(parents=True)
    grace = float(pod.settings["SHUTDOWN_COORDINATOR_GRACE_PERIOD_S"])

    # The frontend and the worker being stopped (A).
    env_a, port_a = worker_env(pod, tmp)
    metrics_a = f"http://127.0.0.1:{port_a}/metrics"
    frontend_log = tmp / "frontend.log"
    _, url = start_frontend(janitor, env_a, frontend_log)
    log_a = tmp / "worker-a.log"
    worker = spawn_logged(janitor, worker_command(pod, model), log_a, env=env_a)
    wait_http(metrics_a, worker, log_a, timeout=DYNAMO_START_S, what="worker A's system port")
    wait_for(lambda: http_ok(url + "/v1/models") and served_by(url) is not None,
             timeout=DYNAMO_START_S, interval=0.5, what="the frontend serves from worker A")
    before = tree(worker.pid)
    names = dict(before)

    coordinator = None
    if mode != "kubelet":
        settings = {**pod.settings, "SHUTDOWN_COORDINATOR_CONFINE_TO_PID": str(worker.pid)}
        if mode == "generic":
            settings["SHUTDOWN_COORDINATOR_ENGINE"] = "generic"
            settings["SHUTDOWN_COORDINATOR_ADOPT_PATTERNS"] = json.dumps([pattern_for(model)])
        coordinator = start_coordinator_with(janitor, tmp, settings)
        wait_for(lambda: set(before) <= {p["pid"] for p in coordinator.status()["processes"]},
                 timeout=60, what="the coordinator lists worker A")

    # The streams, all on A (the only worker yet).
    outs = [Stream(url, tokens, f"bench-{mode}-{i}") for i in range(streams)]
    threads = [threading.Thread(target=o.run, daemon=True) for o in outs]
    for thread in threads:
        thread.start()
    for out in outs:
        out.first.wait(timeout=120)
    ids_a = {w for o in outs for w in o.by_worker}
    if len(ids_a) != 1:
        row.notes.append(f"the streams began on {len(ids_a)} workers: {sorted(ids_a)}")
    id_a = next(iter(ids_a), -1)
    row.workers[id_a] = "A"

    # The second, plain worker (B), routed to before the stop.
    env_b, port_b = worker_env(pod, tmp)
    log_b = tmp / "worker-b.log"
    worker_b = spawn_logged(janitor, worker_command(pod, model), log_b, env=env_b)
    janitor.service(worker_b)
    wait_http(f"http://127.0.0.1:{port_b}/metrics", worker_b, log_b, timeout=DYNAMO_START_S,
              what="worker B's system port")
    id_b = wait_for(lambda: next((w for w in (served_by(url),) if w not in (None, id_a)), None),
                    timeout=60, interval=0.2, what="the frontend routes to worker B")
    row.workers[id_b] = "B"
    running = sum(o.ended_at is None for o in outs)
    if running < streams:
        row.notes.append(f"only {running} of {streams} streams still ran at the stop")

    # The stop.
    exited: list[float] = []

    def watch() -> None:
        worker.wait()
        exited.append(time.time())
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stop = time.time()
    new: list[int | None] = []
    after: list[int | None] = []

    def send_new() -> None:
        time.sleep(NEW_AT_S)
        for _ in range(NEW_REQUESTS):
            new.append(served_by(url))

    def send_after_sigterm() -> None:
        while GRACEFUL not in plain(log_a):
            if time.time() > stop + grace:
                return
            time.sleep(0.05)
        for _ in range(AFTER_SIGTERM_REQUESTS):
            after.append(served_by(url))
    senders = [threading.Thread(target=send_new, daemon=True),
               threading.Thread(target=send_after_sigterm, daemon=True)]
    for sender in senders:
        sender.start()
    summary: dict[str, Any] | None = None
    if coordinator is None:
        worker.send_signal(signal.SIGTERM)
    else:
        if mode == "generic":
            (tmp / "hook-token").write_text(f"{coordinator.token}\n")
            command = [sys.executable, str(DRAIN_HOOK), "--url", coordinator.url,
                       "--token-file", str(tmp / "hook-token")]
        else:
            command = hook_command(pod, coordinator, tmp)
        try:
            hook = subprocess.run(command, capture_output=True, text=True, timeout=grace,
                                  check=False)
            row.hook = (f"exit {hook.returncode} after {time.time() - stop:.1f} s: "
                        f"{hook.stdout.strip()[:300]}")
            row.in_flight_at_hook = sum(o.ended_at is None for o in outs)
        except subprocess.TimeoutExpired:
            row.hook = f"still running at the grace period ({grace:.0f} s), ended"
        if worker.poll() is None and time.time() < stop + grace:
            row.kubelet_sigterm = f"at +{time.time() - stop:.1f} s"
            worker.send_signal(signal.SIGTERM)  # the kubelet's, once the hook returned
        else:
            row.kubelet_sigterm = "none: the worker had exited when the hook returned"
    watcher.join(timeout=max(0.0, stop + grace - time.time()))
    if worker.poll() is None:
        worker.kill()  # the kubelet's SIGKILL at the grace period
        row.sigkilled.append(f"worker A (still running {grace:.0f} s after the stop)")
        watcher.join(timeout=30)
    code = worker.wait()
    row.worker_status = status_text(code)
    row.seconds = (exited[0] if exited else time.time()) - stop
    if coordinator is not None:
        with coordinator.client(timeout=120) as client:
            summary = client.get("/drain").json()

    for thread in [*threads, *senders]:
        thread.join(timeout=120)
    row.new_routed = [row.workers.get(w, str(w)) if w is not None else "failed" for w in new]
    row.after_sigterm = [row.workers.get(w, str(w)) if w is not None else "failed"
                         for w in after]
    # Whatever of A's tree outlives it gets a while to go, then is SIGKILLed and counted.
    procs = []
    for pid in before:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, left = psutil.wait_procs(procs, timeout=SETTLE_S)
    for proc in left:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            row.sigkilled.append(f"{names.get(proc.pid, proc.name())} ({SETTLE_S:.0f} s after A)")
            proc.kill()
        except psutil.NoSuchProcess:
            pass

    row.streams = outs
    if summary is not None:
        row.outcome = str(summary.get("outcome"))
        for p in summary["processes"]:
            parts = [f"{p['pid']} {p['fate']}", f"exit {p.get('exit_code')}",
                     f"signal {p.get('signal')}", f"tier {p.get('tier')}"]
            for key in ("signalled_at", "killed_at", "ended_at"):
                if p.get(key):
                    parts.append(f"{key.removesuffix('_at')} +{p[key] - stop:.1f} s")
            row.fates.append(", ".join(parts))
        timeline = ", ".join(f"{t['phase']} +{t['at'] - stop:.1f}" for t in summary["timeline"]
                             if t["at"] >= stop - 1)
        row.notes.append(f"drain timeline (s from the stop): {timeline}")
    log = plain(log_a).splitlines()
    row.shutdown_signals = sum(GRACEFUL in line for line in log)
    row.waited_inflight = sum(WAITING in line for line in log)
    row.timeouts = sum(any(m in line for m in TIMEOUTS) for line in log)
    row.errors = sum(bool(ERROR.match(line)) for line in log)
    row.log_lines = [line for line in log if any(m in line for m in WORKER_LINES)
                     and UNREGISTER not in line]
    row.notes.append(f"worker A: {sum(UNREGISTER in line for line in log)} "
                     f"'{UNREGISTER} ... from discovery' warnings")
    frontend_lines = plain(frontend_log).splitlines()
    row.migration_lines = [line for line in frontend_lines if MIGRATION.search(line)
                           and "Request migration enabled" not in line
                           and "migration.is_retry=false" not in line]
    row.retries = sum(bool(RETRY.search(line)) for line in frontend_lines)
    for out in outs:
        out.read_frontend(frontend_lines)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1500)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="engine-profiles-dynamo-"))
    model = write_tiny_model(scratch / "model")
    pod = rendered("dynamo-worker", scratch / "render")
    rows: list[Row] = []
    os.chdir(ROOT)
    for name, mode in ROWS:
        janitor = ProcessJanitor()
        try:
            rows.append(run_row(name, mode, pod, janitor, scratch / f"row-{len(rows)}", model,
                                args.streams, args.tokens))
        finally:
            janitor.close()
        rows[-1].notes += [f"janitor: {p}" for p in janitor.problems]
    print(f"\nDynamo worker runtime (dynamo.mocker), {args.streams} streams x {args.tokens} "
          f"tokens in flight at the stop, a second worker to migrate to\n")
    print(f"{'how the pod stopped':29} {'worker':>7} {'outcome':>8} {'whole':>5} {'cut':>3} "
          f"{'migrated':>8} {'signals':>7} {'waited':>6} {'timeouts':>8} {'errors':>6} "
          f"{'SIGKILLed':>9} {'seconds':>7} {'new->A':>6} {'after->A':>8}")
    for row in rows:
        whole = sum(s.whole for s in row.streams)
        migrated = sum(bool(s.migrations) for s in row.streams)
        to_a = f"{row.new_routed.count('A')}/{len(row.new_routed)}"
        after_a = f"{row.after_sigterm.count('A')}/{len(row.after_sigterm)}"
        print(f"{row.name:29} {row.worker_status:>7} {row.outcome:>8} {whole:>5} "
              f"{len(row.streams) - whole:>3} {migrated:>8} {row.shutdown_signals:>7} "
              f"{row.waited_inflight:>6} {row.timeouts:>8} {row.errors:>6} "
              f"{len(row.sigkilled):>9} {row.seconds:>7.1f} {to_a:>6} {after_a:>8}")
    print("\nworker: its wait status; signals: its 'Received shutdown signal' lines; waited: "
          "its 'Waiting for inflight requests' lines; timeouts: its timeout, force-exit and "
          "Traceback lines; errors: its ERROR lines; seconds: from the stop (the signal, or "
          "the hook's start) to its exit; migrated: streams the frontend re-issued to another "
          "worker (its log's 'migration retry scheduled'); new->A: of the short requests sent "
          f"from {NEW_AT_S:g} s after the stop, those the frontend routed to the stopped "
          f"worker; after->A: the same of {AFTER_SIGTERM_REQUESTS} sent once it logged its "
          "shutdown signal")
    for row in rows:
        print(f"\n{row.name}:")
        if row.hook:
            print("  hook: " + row.hook)
        if row.in_flight_at_hook is not None:
            print(f"  streams in flight when the hook returned: {row.in_flight_at_hook}")
        if row.kubelet_sigterm:
            print("  kubelet's SIGTERM after the hook: " + row.kubelet_sigterm)
        for fate in row.fates:
            print("  fate: " + fate)
        for note in row.notes:
            print("  " + note)
        if row.sigkilled:
            print("  SIGKILLed by the bench: " + ", ".join(row.sigkilled))
        print(f"  new requests from +{NEW_AT_S:g} s routed to: " + ", ".join(row.new_routed))
        print("  new requests once it logged its shutdown signal routed to: "
              + ", ".join(row.after_sigterm))
        for i, s in enumerate(row.streams):
            named = ", ".join(f"{row.workers.get(w, w)}: {n}" for w, n in s.by_worker.items())
            routed = " -> ".join(str(row.workers.get(w, w)) for w in s.routed)
            moved = "; ".join(m.replace(str(id_), name) for m in s.migrations
                              for id_, name in row.workers.items() if str(id_) in m)
            print(f"  stream {i}: {s.tokens} tokens, finish {s.finish}, [DONE] {s.done}, "
                  f"error {s.error}; routed to {routed or '?'}"
                  + (f" (migrated {moved})" if moved else "")
                  + f"; chunks' nvext.worker_id: {named}")
        print(f"  frontend: {row.retries} lines with migration.is_retry=true")
        for line in row.migration_lines[:8]:
            print("  frontend: " + short(line))
        for line in row.log_lines[:16]:
            print("  worker: " + short(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
