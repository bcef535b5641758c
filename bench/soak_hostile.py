"""Hostile requests sent to a coordinator while its drain runs (``bench/soak.py``, kind
``hostile``). Each must be refused with a 4xx (or be harmless), never answered 5xx, and
none may cancel the drain; raw JSON text, so ``NaN`` and ``1e309`` reach the server as sent.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import httpx

JSON = {"content-type": "application/json"}
BIG_BODY_BYTES = 5 * 1024 * 1024
NESTING = 500
SLOW_S = 5.0
"""An answer slower than this counts as a failure (a pattern that blocks the loop, say)."""
HOSTILE_ID = "soak-hostile-handoff"
"""The request id the hostile handoff reports carry (acknowledged afterwards, in case)."""


@dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    allowed: frozenset[int]
    """Statuses that are a refusal or harmless; anything else is a failure."""
    closed_ok: bool = False
    """The server may close the connection instead of answering (a refused big body)."""


CLIENT_ERRORS = frozenset(range(400, 500))


def thread_ids(pid: int) -> list[int]:
    """Thread ids of ``pid`` other than its own PID (its other threads)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except OSError:
        return []


def battery(engine_pid: int, worker_id: str, auth: dict[str, str]) -> list[Hostile]:
    """The hostile requests for a drain of the engine ``engine_pid`` (worker ``worker_id``)."""
    report = f"/workers/{worker_id}/report"
    json_auth = {**JSON, **auth}
    nested = '{"d":' * NESTING + "1" + "}" * NESTING
    nested_list = "[" * NESTING + "1" + "]" * NESTING
    out = [
        Hostile(f"{name} in {field}", "POST", path, text.encode(), json_auth, CLIENT_ERRORS)
        for value in ("NaN", "Infinity", "-Infinity", "1e309")
        for name, field, path, text in (
            (value, "deadline_s", "/drain", f'{{"wait": false, "deadline_s": {value}}}'),
            (value, "pid", "/workers", f'{{"pid": {value}}}'),
            (value, "start_time", "/workers",
             f'{{"pid": {engine_pid}, "start_time": {value}}}'),
            (value, "inflight", report, f'{{"inflight": {value}}}'),
            (value, "tokens", report,
             f'{{"handoffs": [{{"request_id": "{HOSTILE_ID}", "tokens": {value}}}]}}'),
        )
    ]
    out += [
        Hostile("detail nested 500 objects deep", "POST", report,
                f'{{"handoffs": [{{"request_id": "{HOSTILE_ID}", "detail": {nested}}}]}}'
                .encode(), json_auth, CLIENT_ERRORS),
        Hostile("detail nested 500 lists deep", "POST", report,
                f'{{"handoffs": [{{"request_id": "{HOSTILE_ID}", "detail": {nested_list}}}]}}'
                .encode(), json_auth, CLIENT_ERRORS),
        Hostile("5 MiB body without the token", "POST", "/workers",
                _big_body(), JSON, frozenset({401}), closed_ok=True),
        Hostile("5 MiB body with a wrong token", "POST", "/workers", _big_body(),
                {**JSON, "Authorization": "Bearer not-the-token"}, frozenset({401}),
                closed_ok=True),
        Hostile("RE2-hostile tier pattern (a+)+$, the engine again", "POST", "/workers",
                f'{{"pid": {engine_pid}, "tiers": [{{"name": "evil", "pattern": "(a+)+$"}}]}}'
                .encode(), json_auth, CLIENT_ERRORS | {200}),
        Hostile("backreference tier pattern", "POST", "/workers",
                f'{{"pid": {engine_pid}, "tiers": [{{"name": "evil", "pattern": "(a)\\\\1"}}]}}'
                .encode(), json_auth, CLIENT_ERRORS),
    ]
    for tid in thread_ids(engine_pid)[:2]:
        out.append(Hostile(f"a thread id of the engine ({tid})", "POST", "/workers",
                           f'{{"pid": {tid}}}'.encode(), json_auth, CLIENT_ERRORS))
    pid1 = thread_ids(1)[:1] or [1]
    out.append(Hostile(f"a thread of PID 1 ({pid1[0]})", "POST", "/workers",
                       f'{{"pid": {pid1[0]}}}'.encode(), json_auth, CLIENT_ERRORS))
    return out


SACRIFICE = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text("up")
while True:
    time.sleep(3600)
"""
"""``python -c SACRIFICE READY_FILE aaa…a!``: a process registered with the tier pattern
``(a+)+$``, whose command line is that pattern's classic catastrophic input for a
backtracking engine (40 ``a`` and a ``!``). The drain's kill matches the pattern against it;
on SIGTERM it exits 0."""
SACRIFICE_TAIL = "a" * 40 + "!"


def register_sacrifice(pid: int) -> bytes:
    """The registration of the sacrifice with the RE2-hostile tier."""
    return (f'{{"pid": {pid}, "name": "soak-sacrifice", '
            f'"tiers": [{{"name": "evil", "pattern": "(a+)+$"}}]}}').encode()


def _big_body() -> bytes:
    pad = "x" * (BIG_BODY_BYTES - 32)
    return f'{{"pid": 1, "pad": "{pad}"}}'.encode()


async def send(url: str, requests: list[Hostile]) -> list[str]:
    """Send each request; returns one line per failure (5xx, an answer not allowed, a
    transport error where no close is allowed, or a slow answer)."""
    failures: list[str] = []
    async with httpx.AsyncClient(timeout=30.0) as http:
        for h in requests:
            began = time.monotonic()
            try:
                response = await http.request(h.method, url + h.path, content=h.body,
                                              headers=h.headers)
            except httpx.TransportError as exc:
                if not h.closed_ok:
                    failures.append(f"{h.name}: {type(exc).__name__} {exc}")
                continue
            took = time.monotonic() - began
            if response.status_code not in h.allowed:
                failures.append(f"{h.name}: {response.status_code} {response.text[:200]}")
            elif took > SLOW_S:
                failures.append(f"{h.name}: answered after {took:.1f} s")
    return failures
