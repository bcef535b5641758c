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

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import strace_record
from tests.engines.continued import (
    COMPLETION_PROMPT,
    Expected,
    assert_continued,
    assert_ended_cleanly,
    chat_body,
    handed_back,
    reference,
    send,
)
from tests.engines.sglang_stack import (
    Sglang,
    completion_body,
    drain,
    start_drainable_pod,
    start_sglang,
    trace_tree,
)
from tests.support.processes import ProcessJanitor

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(900),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

TOKENS = 600
"""Tokens of each stream: well past the drain's start here (about 50-100 tokens a second)."""


@pytest.fixture(scope="module")
def peer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sglang]:
    """A plain SGLang the drained server's streams continue on, shared by the module's tests
    (nothing drains it)."""
    janitor = ProcessJanitor()
    try:
        yield start_sglang(janitor, tmp_path_factory.mktemp("peer"), tiny_model)
    finally:
        janitor.close()


@pytest.fixture(scope="module")
def expected(peer: Sglang) -> Expected:
    return reference(peer.url, peer.model, TOKENS)


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
       before it streams text: round robin puts one of each on the drainable server;
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
    completion = completion_body(peer.model, COMPLETION_PROMPT, TOKENS)
    if not by_ids:
        del completion["return_token_ids"]
    pod = start_drainable_pod(janitor, tmp_path, tiny_model, peer, 90, router)
    trace = trace_tree(janitor, tmp_path, pod.drained.proc.pid, "drained")

    streams = {name: send(pod.proxy_url, path, body, name) for name, path, body in [
        ("completion-1", "/v1/completions", completion),
        ("completion-2", "/v1/completions", completion),
        ("chat-1", "/v1/chat/completions", chat_body(peer.model, TOKENS)),
        ("chat-2", "/v1/chat/completions", chat_body(peer.model, TOKENS)),
    ]}
    summary = drain(pod.coordinator, tmp_path, "summary")

    assert_continued(streams, expected, by_ids)
    handed_back(pod.drained.log)
    processes = assert_ended_cleanly(pod.drained.proc, trace, summary)
    assert processes[pod.drained.proc.pid]["tier"] == "sglang-main"
