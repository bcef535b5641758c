"""The drainable vLLM server (``deploy/examples/vllm/drainable_server.py``, vLLM's own
``AsyncLLM`` with worker_client) drained under streaming load: its streams, handed back
mid-way, are continued on a second, unmodified vLLM through the continuation proxy in front
of vllm-router or smg, and every process of the drained server ends cleanly.

Ground truth: the client's token ids (``return_token_ids``) and text against what the second
server generates for the same request in one piece (greedy, the same dummy weights: two
servers give the same tokens); the drained server's own log (which requests it handed back,
after how many tokens); the second server's own log of every request it received
(``--enable-log-requests``: each attempt served once); strace's record of every process of
the drained tree (exit codes, and every signal a process of it sent: no SIGKILL from anyone).
The coordinator's summary and the proxy's counters are held against those records.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import strace_record
from tests.engines.continued import (
    COMPLETION_PROMPT,
    Expected,
    assert_continued,
    assert_counts_agree,
    assert_ended_cleanly,
    chat_body,
    handed_back,
    reference,
    send,
)
from tests.engines.sglang_stack import (
    StartDrained,
    completion_body,
    drain,
    start_drainable_pod,
    trace_tree,
)
from tests.engines.stack import ROOT, Coordinator, Vllm, peer_core_env, start_vllm
from tests.support.processes import ProcessJanitor, wait_for

pytestmark = [
    pytest.mark.engine, pytest.mark.timeout(900),
    pytest.mark.skipif(not strace_record.available(), reason="strace is not installed"),
]

SERVER = ROOT / "deploy" / "examples" / "vllm" / "drainable_server.py"
TOKENS = 4000
"""Tokens of each stream. The tiny model makes about a token a millisecond here, shared by
two streams on each server: a stream is still running seconds after the four have started
(and the drain starts the moment they have), and its continuation re-reads some hundreds of
tokens at most."""
MAX_MODEL_LEN = 8192
"""Both servers alike: the same flags, the same dummy weights."""
GRACE_S = 240
"""The pod's grace period: room for the Worker's teardown on a loaded machine (seconds of
garbage collection on its core; the server lets it take 60 s, EngineCore's tier 75 s). Beside
other engines, and the peer's Worker on the same core, the drained server's Worker took 46 s
to exit, once more than 60 s: the peer is bound to another core (``peer_core_env``). A drain
that goes well ends long before."""
RECEIVED = re.compile(r"Received request (?:chat)?cmpl-(\S+?)\.(\d+)(?:-\d+)?: params")
"""The peer's line for each request it takes: ``cmpl-{X-Request-Id}-{prompt index}`` or
``chatcmpl-{X-Request-Id}``; the proxy names each attempt ``{stream}.{attempt}``."""


@pytest.fixture(scope="module")
def peer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    """A stock vLLM the drained server's streams continue on, shared by the module's tests
    (nothing drains it); it logs every request it receives."""
    janitor = ProcessJanitor()
    try:
        yield start_vllm(janitor, tmp_path_factory.mktemp("peer"), tiny_model,
                         max_model_len=MAX_MODEL_LEN, flags=["--enable-log-requests"],
                         extra_env=peer_core_env())
    finally:
        janitor.close()


@pytest.fixture(scope="module")
def expected(peer: Vllm) -> Expected:
    return reference(peer.url, peer.served_model, TOKENS)


def start_drainable(janitor: ProcessJanitor, tmp: Path, model: Path) -> StartDrained[Vllm]:
    """Starts the drainable vLLM server, with the peer's flags, registered with a coordinator."""

    def start(port: int, coordinator: Coordinator) -> Vllm:
        return start_vllm(janitor, tmp, model, max_model_len=MAX_MODEL_LEN, port=port,
                          argv=[str(SERVER), "--coordinator", coordinator.url])
    return start


@pytest.mark.parametrize("router", ["vllm-router", "smg"])
def test_vllm_streams_handed_back_mid_way_continue_exactly_and_every_process_exits_0(
    router: str, janitor: ProcessJanitor, tmp_path: Path, tiny_model: Path, peer: Vllm,
    expected: Expected,
) -> None:
    """1. what the peer (stock vLLM) generates whole: a 4000-token completion's ids and
       text, a chat's text;
    2. the router (round robin) in front of the peer; the drainable server's coordinator,
       told of the router, and the drainable server registered with it; the coordinator
       adds it to the router; strace on its whole tree;
    3. the continuation proxy in front of the router, acknowledging handoffs to that
       coordinator: in front of vllm-router the completions ask for token ids and are
       continued by them; smg refuses a token-id prompt, so in front of it they are
       continued by text;
    4. two completions and two chats streamed through the proxy, each sent once the one
       before it streams text: round robin puts one of each on the drainable server;
    5. GET /drain, as the preStop hook calls it, once all four stream: the server hands its
       two back mid-stream (its log), the proxy continues them through the router, which
       no longer sends to it, on the peer (its log: each attempt received once);
    6. every stream ends with [DONE], 4000 tokens: each completion's token ids (its text in
       front of smg) exactly the peer's, each chat's text exactly the peer's;
    7. every process of the drained server exited 0 (strace), none died of a signal, none
       sent a SIGKILL; the drain is graceful with nothing lost, and its handoff counts are
       the drained server's and the proxy's."""
    assert len(expected.ids) == TOKENS
    by_ids = router == "vllm-router"
    model = peer.served_model
    completion = completion_body(model, COMPLETION_PROMPT, TOKENS)
    if not by_ids:
        del completion["return_token_ids"]
    pod = start_drainable_pod(janitor, tmp_path, tiny_model, peer, GRACE_S, router,
                              start_drained=start_drainable(janitor, tmp_path, tiny_model))
    trace = trace_tree(janitor, tmp_path, pod.drained.proc.pid, "drained")
    peer_seen = peer.log.stat().st_size  # the peer's log before this test's requests

    streams = {name: send(pod.proxy_url, path, body, name) for name, path, body in [
        ("completion-1", "/v1/completions", completion),
        ("completion-2", "/v1/completions", completion),
        ("chat-1", "/v1/chat/completions", chat_body(model, TOKENS)),
        ("chat-2", "/v1/chat/completions", chat_body(model, TOKENS)),
    ]}
    summary = drain(pod.coordinator, tmp_path, "summary")

    assert_continued(streams, expected, by_ids)
    # The drained server's log: its first attempts handed back mid-stream.
    handed = handed_back(pod.drained.log)
    assert all(0 < tokens < TOKENS for _, attempt, tokens in handed if attempt == 0), handed
    # The peer's log: every stream's last attempt, once, after every attempt handed back.
    peer_log = peer.log.read_bytes()[peer_seen:].decode(errors="replace")
    received = [(name, int(attempt)) for name, attempt in RECEIVED.findall(peer_log)]
    for name in streams:
        served = [attempt for got, attempt in received if got == name]
        assert len(served) == 1, (name, received)
        assert all(attempt < served[0] for got, attempt, _ in handed if got == name), handed
    assert_ended_cleanly(pod.drained.proc, trace, summary)

    # The counts: the coordinator's, the proxy's and the drained server's agree.
    want = assert_counts_agree(summary["migration_counts"], handed, len(streams))

    def proxy_counts() -> dict[str, float]:
        metrics = pod.proxy.metrics()
        return {name: metrics[f"continuation_proxy_{name}_total"] for name in want}

    # The proxy counts an acknowledgement once the coordinator answered it, which may be
    # after the coordinator's summary went out.
    wait_for(lambda: proxy_counts() == want, timeout=30, interval=0.2,
             what=f"the proxy's counts {want}: {proxy_counts()}")
