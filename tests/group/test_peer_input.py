"""What a group's peers may send a coordinator, and what it refuses: the token, hostile
sizes, counts and numbers (a clear 4xx, never a 5xx), leader-only calls on a follower, and
no message that could make a coordinator signal anything (only phases and summaries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.group.rig import TOKEN, group_status
from tests.service.servers import Running, start_coordinator
from tests.support.processes import ProcessJanitor, wait_for


@pytest.fixture
def pair(janitor: ProcessJanitor, tmp_path: Path) -> tuple[Running, Running]:
    """A leader of a group of 3 and one follower of it, both with the group's token."""
    leader = start_coordinator(janitor, tmp_path, "--group-size", "3", "--group-index", "0",
                               token=TOKEN, name="leader")
    follower = start_coordinator(janitor, tmp_path, "--group-size", "3", "--group-index", "1",
                                 "--group-leader", leader.url, token=TOKEN, name="follower")
    wait_for(lambda: [m["index"] for m in group_status(leader)["members"]] == [1],
             what="the follower announced")
    return leader, follower


PROCESS = {"pid": 4242, "name": "rank", "role": "rank", "fate": "exited", "exit_code": 0}


@pytest.mark.parametrize(("path", "body", "status", "says"), [
    ("/group/members", {"index": 0}, 422, "greater than or equal to 1"),
    ("/group/members", {"index": 3}, 422, "not a follower of this group of 3"),
    ("/group/members", {"index": 10**12}, 422, "less than or equal to"),
    ("/group/members", {"index": "one"}, 422, "integer"),
    ("/group/members", {"index": 1, "url": "file:///etc/passwd"}, 422, "pattern"),
    ("/group/members", {"index": 1, "url": "http://" + "x" * 3000}, 422, "at most 2048"),
    ("/group/members", [1, 2], 422, "valid dictionary"),
    ("/group/members/1/summary", {"processes": [{**PROCESS, "pid": -1}]}, 422, "greater"),
    ("/group/members/1/summary", {"processes": [{**PROCESS, "fate": "vanished"}]}, 422,
     "Input should be"),
    ("/group/members/1/summary", {"processes": [{**PROCESS, "exit_code": 2**40}]}, 422,
     "less than or equal to 255"),
    ("/group/members/1/summary", {"processes": [PROCESS] * 100_001}, 422, "at most 100000"),
    ("/group/members/1/summary", {"causes": ["x" * 2000]}, 422, "at most 1000"),
    ("/group/members/1/summary", {"mode": "remote"}, 422, "'group' or 'local'"),
    ("/group/members/0/summary", {}, 422, "greater than or equal to 1"),
    ("/group/members/2/summary", {}, 409, "no group drain to report on"),
])
def test_hostile_peer_input_gets_a_clear_4xx(pair: tuple[Running, Running], path: str,
                                             body: Any, status: int, says: str) -> None:
    """1. Send the leader a malformed, oversized or out-of-range group message. 2. It answers
    the 4xx with a ``detail`` that says why (a summary outside a drain is a 409), and still
    serves: the group it shows is unchanged."""
    leader, _ = pair
    before = {m["index"] for m in group_status(leader)["members"]}
    with leader.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert says in response.text
    assert {m["index"] for m in group_status(leader)["members"]} == before
    assert leader.status()["phase"] == "serving"


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"1e309"])
def test_a_nan_or_an_infinity_in_a_message_is_refused(pair: tuple[Running, Running],
                                                      number: bytes) -> None:
    """A NaN or an infinity (not JSON, but what Python's encoder writes) is refused like any
    other input, in an index and in a summary."""
    leader, _ = pair
    with leader.client() as client:
        for path, body in (("/group/members", b'{"index": %s}' % number),
                           ("/group/members/1/summary",
                            b'{"processes": [{"pid": %s, "fate": "exited"}]}' % number)):
            response = client.post(path, content=body,
                                   headers={"Content-Type": "application/json"})
            assert response.status_code == 422, response.text


def test_group_calls_need_the_token_and_leader_calls_need_the_leader(
        pair: tuple[Running, Running]) -> None:
    """1. Every group route without the token: 401. 2. A follower asked to take members or
    summaries: 409 naming its leader. 3. The follower's own GET /group shows its state."""
    leader, follower = pair
    for url in (leader.url, follower.url):
        assert httpx.get(f"{url}/group").status_code == 401
        assert httpx.post(f"{url}/group/members", json={"index": 1}).status_code == 401
    with follower.client() as client:
        refused = client.post("/group/members", json={"index": 2})
        assert refused.status_code == 409
        assert leader.url in refused.json()["detail"]
        own = client.get("/group").json()
    assert (own["index"], own["role"]) == (1, "follower")


def test_no_group_message_names_a_process_to_signal(pair: tuple[Running, Running]) -> None:
    """A summary's process list is a report, not a target: a follower reporting a PID that
    runs on the leader's host leaves it alone, and an announce carrying PIDs or patterns has
    them ignored (no such field exists)."""
    leader, _ = pair
    with leader.client() as client:
        answer = client.post("/group/members", json={"index": 2, "pid": 1,
                                                     "adopt_pattern": ".*"})
    assert answer.status_code == 200
    status = leader.status()
    assert status["phase"] == "serving"
    assert status["adopted"] == []
    assert status["workers"] == []


def test_status_shows_the_group_to_a_person(pair: tuple[Running, Running],
                                            tmp_path: Path) -> None:
    """``shutdown-coordinator status`` names each pod's place in its group: the leader how
    many followers it knows, a follower its state and its leader."""
    leader, follower = pair
    token = tmp_path / "status.token"
    token.write_text(TOKEN)
    shown = {}
    for name, running in (("leader", leader), ("follower", follower)):
        done = subprocess.run(
            [sys.executable, "-m", "coordinator", "status", "--url", running.url,
             "--token-file", str(token)], capture_output=True, text=True, timeout=60,
            cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr
        shown[name] = next(line for line in done.stdout.splitlines()
                           if line.startswith("group "))
    assert shown["leader"].endswith("leader 0 of 3, 1 of 2 followers known")
    assert f"follower 1 of 3, joined, leader {leader.url}" in shown["follower"]
