"""Streams handed back by a drainable server and continued on a real peer through the proxy:
the requests, what the peer generates whole for them (the reference: greedy, the same dummy
weights, so the same tokens on both servers), and the checks the streams and the drained
server's tree are held to.

    expected = reference(peer.url, model, TOKENS)       # once per module
    streams = {name: send(pod.proxy_url, path, body, name) for ...}
    summary = drain(pod.coordinator, tmp_path, "summary")
    assert_continued(streams, expected, by_ids)
    handed = handed_back(pod.drained.log)               # the drained server's own record
    processes = assert_ended_cleanly(pod.drained.proc, trace, summary)
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.engines.sglang_stack import Stream, Trace, completion_body, start_stream
from tests.engines.stack import alive
from tests.engines.tiny_model import prompt
from tests.support.processes import wait_for

MESSAGES = [{"role": "user", "content": prompt(5)}]
COMPLETION_PROMPT = prompt(6)
HANDED = re.compile(r"handed back request (\S+)\.(\d+) after (\d+) tokens")
"""A drainable server's line for each request it handed back; the proxy names each attempt
``{stream}.{attempt}``."""


@dataclass
class Expected:
    """What the peer generates whole for the test's requests."""

    ids: list[int]
    """The completion's token ids."""
    completion: str
    """The completion's text."""
    chat: str
    """The chat's text."""


def chat_body(model: str, tokens: int) -> dict[str, Any]:
    """A greedy chat that runs to ``tokens``."""
    return {"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}


def reference(url: str, model: str, tokens: int) -> Expected:
    """The completion and the chat, each generated whole by the server at ``url``."""
    completion = httpx.post(url + "/v1/completions", timeout=600,
                            json=completion_body(model, COMPLETION_PROMPT, tokens)).json()
    chat = httpx.post(url + "/v1/chat/completions", timeout=600,
                      json=chat_body(model, tokens)).json()
    choice = completion["choices"][0]
    return Expected(choice["token_ids"], choice["text"], chat["choices"][0]["message"]["content"])


def send(url: str, path: str, body: dict[str, Any], name: str) -> Stream:
    """Stream ``body`` as ``name`` (its ``X-Request-Id``); return once its first text arrived:
    the router sent it on and the server it landed on generates (a chat's first chunk, the
    role alone, may come before)."""
    stream = start_stream(url + path, body, {"X-Request-Id": name})
    wait_for(lambda: bool(stream.text) or stream.ended.is_set(), timeout=300,
             what=f"{name} streaming")
    assert stream.error is None, (name, stream.error)
    return stream


def assert_continued(streams: dict[str, Stream], expected: Expected, by_ids: bool) -> None:
    """Every stream ended with ``[DONE]``, continued by the proxy (no handed-back event reached
    the client): a completion's token ids (its text unless ``by_ids``) and a chat's text
    exactly the reference's."""
    for name, stream in streams.items():
        assert stream.ended.wait(timeout=300), name
        assert stream.whole, (name, stream.error)
        assert stream.handed_back is None, name
        if name.startswith("completion") and by_ids:
            assert stream.tokens == expected.ids, name
        elif name.startswith("completion"):
            assert stream.text == expected.completion, name
        else:
            assert stream.text == expected.chat, name


def handed_back(log: Path) -> list[tuple[str, int, int]]:
    """(stream, attempt, tokens) of each request the drainable server handed back, from its
    log; asserts its first attempts were one completion and one chat (round robin put one of
    each on it). A continuation the router still sent it before it was told is handed back
    again, before its first token."""
    handed = [(name, int(attempt), int(tokens))
              for name, attempt, tokens in HANDED.findall(log.read_text(errors="replace"))]
    first = sorted(name for name, attempt, _ in handed if attempt == 0)
    assert [name.split("-")[0] for name in first] == ["chat", "completion"], handed
    assert all(tokens == 0 for _, attempt, tokens in handed if attempt), handed
    return handed


def assert_counts_agree(counts: dict[str, int], handed: list[tuple[str, int, int]],
                        streams: int) -> dict[str, int]:
    """The coordinator's ``migration_counts`` are the drained server's log (``handed``):
    every hand-back acknowledged, none expired or pending. Returns what the proxy's counters
    must then read: a hand-back before the first token is retried as a refusal is, not
    counted a continuation."""
    assert (counts["handed_back"], counts["acked"], counts["expired"], counts["pending"]) == (
        len(handed), len(handed), 0, 0), counts
    mid_stream = sum(1 for _, _, tokens in handed if tokens)
    return {"handed_back": len(handed), "acked": len(handed), "continuations": mid_stream,
            "broken": 0, "completed": streams, "streams": streams}


def assert_ended_cleanly(proc: subprocess.Popen[Any], trace: Trace,
                         summary: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The drained server's main process exited 0; strace: every process of its tree exited
    0, none sent a SIGKILL; the drain was graceful with nothing lost and its exit codes are
    those; nothing of the tree is left. Returns the summary's processes by PID."""
    assert proc.wait(timeout=120) == 0
    record = trace.record()
    for pid, name in trace.names.items():
        end = record.ends[pid]
        assert end.exit_code == 0, (name, end)
    assert not [call for calls in record.sent.values() for call in calls
                if call.signal == "SIGKILL"], record.sent
    assert summary["outcome"] == "graceful", summary["drain"]
    assert summary["drain"]["lost_requests"] == 0
    processes = {p["pid"]: p for p in summary["processes"]}
    assert {processes[pid]["exit_code"] for pid in trace.names} <= {0, None}
    assert alive(list(trace.names)) == []
    return processes
