"""Without a token, nobody acts beyond their reach: a real unprivileged user on the same host
(``useradd``) can change nothing that would end, spare or hide a process it could not
signal itself, and can still drain what is its own.

Every verdict is checked against ground truth: the processes' own ``/proc`` entries, not only
the coordinator's answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.service.servers import FAST, Running, register, start_coordinator
from tests.support.neighbour import alive, neighbour, owner
from tests.support.processes import ProcessJanitor, wait_for
from tests.support.units import _check_unshare

ENGINE_ARGS = "6001"
"""``sleep 6001``: root's engine, adopted by its command line."""


def _status(running: Running) -> dict[str, Any]:
    return running.status()


def _refused(answer: dict[str, Any], *words: str) -> None:
    assert answer["status"] == 403, answer
    detail = str(answer["body"]["detail"])
    for word in words:
        assert word in detail, detail


def test_the_neighbour_changes_nothing_of_roots(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a coordinator without a token that adopts root's engine (``sleep 6001``) by pattern;
       root registers a worker of its own (a sleep) and reports 1 request in flight;
    2. as the neighbour: a force drain, a plain POST /drain and the kubelet's GET /drain are
       403 naming UID 0, and nothing started (``/readyz`` 200, both processes run per /proc);
    3. its deregistration, its report of 10^9 in flight and its event stream on root's
       worker are 403: the worker is still registered with 1 in flight;
    4. root starts a drain held in ``migrating`` and its worker hands a request back: the
       neighbour's abort and its acknowledgement are 403, the phase is still ``migrating``
       and the handoff pending;
    5. the neighbour's early acknowledgement of a request root's worker hands back later does
       not settle it: the handoff is listed pending; root aborts;
    6. ``/status`` ``security.enforced`` says what held."""
    user = neighbour(janitor)
    engine = janitor.spawn(["sleep", ENGINE_ARGS], cwd="/", service=True,
                           exit_code=-signal.SIGTERM).pid
    running = start_coordinator(janitor, tmp_path, *FAST, "--grace-period", "60",
                                "--adopt-pattern", f"^sleep {ENGINE_ARGS}$")
    roots_worker = janitor.spawn(["sleep", "600"], cwd="/", service=True,
                                 exit_code=-signal.SIGTERM).pid
    worker = register(running, roots_worker, url="http://127.0.0.1:1")
    with running.client() as client:
        assert client.post(f"/workers/{worker['id']}/report",
                           json={"inflight": 1}).status_code == 200
    wait_for(lambda: engine in [a["pid"] for a in _status(running)["adopted"]] or None,
             what="root's engine adopted")

    # 2.
    url = running.url
    _refused(user.call(url, "POST", "/drain", {"force": True}), "UID 0", f"UID {user.uid}")
    _refused(user.call(url, "POST", "/drain"), "UID 0")
    _refused(user.call(url, "GET", "/drain"), "UID 0")
    assert httpx.get(url + "/readyz").status_code == 200
    assert _status(running)["phase"] == "serving"
    assert alive(engine)
    assert alive(roots_worker)

    # 3.
    _refused(user.call(url, "DELETE", f"/workers/{worker['id']}"), "UID 0")
    _refused(user.call(url, "POST", f"/workers/{worker['id']}/report",
                       {"inflight": 1_000_000_000}), "UID 0")
    _refused(user.call(url, "GET", f"/workers/{worker['id']}/events"), "UID 0")
    [listed] = _status(running)["workers"]
    assert (listed["id"], listed["inflight"], listed["connected"]) == (worker["id"], 1, False)

    # 4.
    with running.client() as client:
        assert client.post("/drain", json={"wait": False}).status_code == 202
        assert client.post(f"/workers/{worker['id']}/report", json={
            "inflight": 1, "handoffs": [{"request_id": "r-pending", "tokens": 3}]}
        ).status_code == 200
        wait_for(lambda: _status(running)["phase"] == "migrating" or None,
                 what="the drain migrating")
        _refused(user.call(url, "DELETE", "/drain"), "UID 0")
        _refused(user.call(url, "POST", "/migrations/ack", {"request_ids": ["r-pending"]}),
                 "UID 0")
        # 5.
        early = user.call(url, "POST", "/migrations/ack", {"request_ids": ["r-later"]})
        assert early["status"] == 200, early
        assert early["body"]["early"] == ["r-later"]
        assert client.post(f"/workers/{worker['id']}/report", json={
            "inflight": 1, "handoffs": [{"request_id": "r-later", "tokens": 5}]}
        ).status_code == 200
        document = _status(running)
        assert document["phase"] == "migrating"
        assert sorted(m["request_id"] for m in document["migrations"]) == ["r-later",
                                                                           "r-pending"]
        assert document["migration_counts"]["acked"] == 0
        assert alive(engine)
        assert alive(roots_worker)
        assert client.delete("/drain").status_code == 200

    # 6.
    enforced = _status(running)["security"]["enforced"]
    assert "could signal every process the drain would signal" in enforced["drain"]
    assert "could signal the worker's process" in enforced["worker"]


def test_the_neighbour_drains_what_is_its_own(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. a coordinator without a token; the neighbour registers its own sleeper (201) and
       reports for it (200); 2. the neighbour acknowledges a request before its worker hands
       it back (a router of its own): the handoff is settled at once, nothing pending;
    3. the neighbour's POST /drain is served: its sleeper is gone (per /proc), ended by the
       drain's SIGTERM as the summary says."""
    user = neighbour(janitor)
    running = start_coordinator(janitor, tmp_path, *FAST)
    mine = user.sleeper(service=False)
    registered = user.call(running.url, "POST", "/workers", {"pid": mine})
    assert registered["status"] == 201, registered
    worker_id = registered["body"]["id"]
    report = user.call(running.url, "POST", f"/workers/{worker_id}/report", {"inflight": 0})
    assert report["status"] == 200, report
    early = user.call(running.url, "POST", "/migrations/ack", {"request_ids": ["r-own"]})
    assert early["body"]["early"] == ["r-own"], early
    handed = user.call(running.url, "POST", f"/workers/{worker_id}/report", {
        "inflight": 0, "handoffs": [{"request_id": "r-own", "tokens": 2}]})
    assert handed["status"] == 200, handed
    document = running.status()
    assert document["migrations"] == []
    assert document["migration_counts"]["acked"] == 1
    drained = user.call(running.url, "POST", "/drain")
    assert drained["status"] == 200, drained
    wait_for(lambda: not alive(mine) or None, what="the neighbour's sleeper ended")
    [entry] = [p for p in drained["body"]["processes"] if p["pid"] == mine]
    assert entry["signal"] == "SIGTERM"


def test_unit_membership_adds_nothing_beyond_the_registering_users_reach(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. one private mount namespace holding a root ``sleep`` and the neighbour's ``sleep``
       (siblings under a root shell); 2. the neighbour registers its own (201); the scans
       list it, never root's sleep (which shares its unit); 3. the neighbour's drain is
       served and ends its own sleep; root's sleep was never signalled and still runs (per
       /proc)."""
    user = neighbour(janitor)
    _check_unshare()
    running = start_coordinator(janitor, tmp_path, *FAST)
    shell = janitor.spawn(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"sleep 6002 & echo $!; {' '.join(user.prefix)} sleep 6003 & echo $!; wait"],
        cwd="/", stdout=subprocess.PIPE, text=True)
    assert shell.stdout is not None
    roots_sleep, users_sleep = int(shell.stdout.readline()), int(shell.stdout.readline())
    try:
        wait_for(lambda: owner(users_sleep) == user.uid or None, what="the neighbour's sleep")
        assert owner(roots_sleep) == 0
        mount_ns = {Path(f"/proc/{pid}/ns/mnt").readlink() for pid in (roots_sleep,
                                                                       users_sleep)}
        assert len(mount_ns) == 1
        assert mount_ns != {Path("/proc/self/ns/mnt").readlink()}

        registered = user.call(running.url, "POST", "/workers", {"pid": users_sleep})
        assert registered["status"] == 201, registered
        listed = wait_for(lambda: (pids := {p["pid"] for p in _status(running)["processes"]})
                          and users_sleep in pids and pids, what="the worker's tree listed")
        assert roots_sleep not in listed
        with running.client() as client:
            plan = client.get("/plan").json()
        assert roots_sleep not in {p["pid"] for t in plan["tiers"] for p in t["processes"]}

        drained = user.call(running.url, "POST", "/drain")
        assert drained["status"] == 200, drained
        wait_for(lambda: not alive(users_sleep) or None, what="the neighbour's sleep ended")
        assert alive(roots_sleep)
        assert roots_sleep not in {p["pid"] for p in drained["body"]["processes"]}
    finally:
        for pid in (roots_sleep, users_sleep):
            if alive(pid):
                signal_quietly(pid)
        shell.wait(timeout=60)


def signal_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
