"""Small waits and lookups shared by the simulated-engine tests."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from devstack.sim import EngineHandle
from devstack.sim.group import GroupHandle
from tests.support.processes import wait_for


def is_gone(pid: int) -> bool:
    """True when the process no longer runs (a zombie nobody reaped yet counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(*pids: int, what: str = "processes to end") -> None:
    wait_for(lambda: all(is_gone(pid) for pid in pids), what=f"{what} {pids}")


def wait_record(engine: EngineHandle, pid: int, **expected: Any) -> dict[str, Any]:
    """Wait until ``pid``'s end record has every ``expected`` field value; return it."""

    def matches() -> dict[str, Any] | None:
        record = engine.record_of(pid)
        if record and all(record.get(k) == v for k, v in expected.items()):
            return record
        return None

    result: dict[str, Any] = wait_for(matches, what=f"record of {pid} with {expected}")
    return result


def wait_ended(engine: EngineHandle, pid: int) -> dict[str, Any]:
    """Wait until ``pid`` has exited and written its final record."""

    def ended() -> dict[str, Any] | None:
        record = engine.record_of(pid)
        return record if record and record.get("ended_at") is not None else None

    result: dict[str, Any] = wait_for(ended, what=f"final record of {pid}")
    return result


async def read_events(
    response: httpx.Response, on_token: Callable[[int], Awaitable[None]] | None = None
) -> tuple[list[str], dict[str, Any] | str]:
    """Read an SSE completion stream: the token texts, and its last event (``"[DONE]"`` or
    the handed-back object). ``on_token(n)`` runs after the n-th token."""
    tokens: list[str] = []
    last: dict[str, Any] | str = ""
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        if payload == "[DONE]":
            return tokens, payload
        event = json.loads(payload)
        if event.get("handed_back"):
            last = event
            continue
        tokens.append(event["choices"][0]["text"])
        if on_token is not None:
            await on_token(len(tokens))
    return tokens, last


def assert_nothing_left(group: GroupHandle) -> None:
    """No process of any pod is in /proc (each was reaped by its parent), and no process is
    left in any pod's network namespace."""
    pids = {pid for pod in group.pods for pid in pod.pids()}
    assert pids >= set(group.ranks().values())
    assert [pid for pid in sorted(pids) if Path(f"/proc/{pid}").exists()] == []
    for pod in group.pods:
        if pod.place.netns:
            inside = subprocess.run(["ip", "netns", "pids", pod.place.netns], check=True,
                                    capture_output=True, text=True).stdout
            assert inside.split() == []
