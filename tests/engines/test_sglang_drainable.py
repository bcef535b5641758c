"""The drainable SGLang integration (``deploy/examples/sglang/drainable_server.py``) run inside
the real SGLang 0.5.23: its streams handed back mid-way are continued on a second real SGLang
through the continuation proxy in front of vllm-router or smg, and every process of the
drained server ends cleanly.

Ground truth: the client's token ids (``return_token_ids``) and text against what the second
server generates for the same request in one piece (greedy, the same dummy weights: two
servers give the same tokens), the drained server's own log (which requests it handed back),
and strace's record of every process of its tree (exit codes, and every signal a process of it
sent: no SIGKILL from anyone).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines import strace_record
from tests.engines.sglang_stack import (
    Sglang,
    Stream,
    completion_body,
    start_drainable_pod,
    start_sglang,
    stream_completion,
    trace_tree,
)
from tests.engines.stack import alive
from tests.engines.tiny_model import prompt
from tests.support.processes import ProcessJanitor

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(900),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

TOKENS = 600
"""Tokens of each stream: well past the drain's start here (about 50-100 tokens a second)."""
MESSAGES = [{"role": "user", "content": prompt(5)}]


@pytest.fixture(scope="module")
def peer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sglang]:
    """A plain SGLang the drained server's streams continue on, shared by the module's tests
    (nothing drains it)."""
    janitor = ProcessJanitor()
    try:
        yield start_sglang(janitor, tmp_path_factory.mktemp("peer"), tiny_model)
    finally:
        janitor.close()


@dataclass
class Expected:
    """What the peer generates whole for the test's requests."""

    ids: list[int]
    """The completion's token ids."""
    completion: str
    """The completion's text."""
    chat: str
    """The chat's text."""


@pytest.fixture(scope="module")
def expected(peer: Sglang) -> Expected:
    completion = httpx.post(peer.url + "/v1/completions", timeout=600,
                            json=completion_body(peer.model, prompt(6), TOKENS)).json()
    chat = httpx.post(peer.url + "/v1/chat/completions", timeout=600, json=chat_body(peer)).json()
    choice = completion["choices"][0]
    return Expected(choice["token_ids"], choice["text"], chat["choices"][0]["message"]["content"])


def chat_body(peer: Sglang) -> dict[str, Any]:
    return {"model": peer.model, "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True}


def send(url: str, path: str, body: dict[str, Any], name: str) -> Stream:
    stream = Stream()
    threading.Thread(target=stream_completion, daemon=True,
                     args=(url + path, body, stream, {"X-Request-Id": name})).start()
    assert stream.started.wait(timeout=300), name
    return stream


@pytest.mark.parametrize("router", ["vllm-router", "smg"])
def test_streams_handed_back_mid_way_continue_exactly_and_every_process_exits_0(
    router: str, janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path, peer: Sglang,
    expected: Expected,
) -> None:
    """1. what the peer generates whole: a 600-token completion's ids and text, a chat's text;
    2. the router (round robin) in front of the peer; the drainable server's coordinator, told
       of the router, and the drainable server (SGLang's own server with worker_client inside)
       registered with it; the coordinator adds it to the router; strace on its whole tree;
    3. the continuation proxy in front of the router, acknowledging handoffs to that
       coordinator: in front of vllm-router the completions ask for token ids and are
       continued by them; smg refuses a token-id prompt, so in front of it they are
       continued by text (the client asks for none, the proxy is told to ask for none);
    4. two completions and two chats streamed through the proxy, each sent once the one
       before it streams: round robin puts one of each on the drainable server;
    5. GET /drain once all four stream: it hands its two back mid-stream (its log), the router
       sends their continuations to the peer (one it still sends the drained server is handed
       back before its first token and retried);
    6. every stream ends with [DONE]: each completion's token ids (its text in front of smg)
       exactly the peer's, each chat's text exactly the peer's;
    7. every process of the drained server exited 0 (strace: its main process, the
       scheduler, the detokenizer, the resource tracker), none died of a signal, none sent
       a SIGKILL; the drain is graceful with nothing lost."""
    assert len(expected.ids) == TOKENS
    by_ids = router == "vllm-router"
    completion = completion_body(peer.model, prompt(6), TOKENS)
    if not by_ids:
        del completion["return_token_ids"]
    pod = start_drainable_pod(janitor, tmp_path, tiny_model, peer, 90, router)
    main = pod.drained.proc.pid
    trace = trace_tree(janitor, tmp_path, main, "drained")

    streams = {
        "completion-1": send(pod.proxy_url, "/v1/completions", completion, "completion-1"),
        "completion-2": send(pod.proxy_url, "/v1/completions", completion, "completion-2"),
        "chat-1": send(pod.proxy_url, "/v1/chat/completions", chat_body(peer), "chat-1"),
        "chat-2": send(pod.proxy_url, "/v1/chat/completions", chat_body(peer), "chat-2"),
    }
    with pod.coordinator.client(timeout=240) as client:
        summary = client.get("/drain").json()
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=1))

    for name, stream in streams.items():
        assert stream.ended.wait(timeout=300), name
        assert stream.whole, (name, stream.error)
        assert stream.handed_back is None, name  # the proxy continued it
        if name.startswith("completion") and by_ids:
            assert stream.tokens == expected.ids, name
        elif name.startswith("completion"):
            assert stream.text == expected.completion, name
        else:
            assert stream.text == expected.chat, name
    # Its log: the first attempts it handed back mid-stream, one completion and one chat; a
    # continuation the router still sent it before it was told (smg settles the removal) is
    # handed back again before its first token and retried.
    log = pod.drained.log.read_text(errors="replace")
    handed = re.findall(r"handed back request (\S+)\.(\d+) after (\d+) tokens", log)
    first = sorted(name for name, attempt, _ in handed if attempt == "0")
    assert len(first) == 2, handed
    assert [name.split("-")[0] for name in first] == ["chat", "completion"], handed
    assert all(tokens == "0" for _, attempt, tokens in handed if attempt != "0"), handed

    assert pod.drained.proc.wait(timeout=120) == 0
    record = trace.record()
    for pid, name in trace.names.items():
        end = record.ends[pid]
        assert end.exit_code == 0, (name, end)
    assert not [call for calls in record.sent.values() for call in calls
                if call.signal == "SIGKILL"], record.sent
    assert summary["outcome"] == "graceful", summary["drain"]
    assert summary["drain"]["lost_requests"] == 0
    processes = {p["pid"]: p for p in summary["processes"]}
    assert processes[main]["tier"] == "sglang-main"
    assert {processes[pid]["exit_code"] for pid in trace.names} <= {0, None}
    assert alive(list(trace.names)) == []
