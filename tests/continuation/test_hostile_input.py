"""What the proxy answers to input it cannot take (always a clear 4xx, never a 5xx), and what
it passes through untouched: other calls, the upstream's own rejection, its health and
metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.sim import EngineHandle
from tests.continuation.stack import Proxy, start_proxy
from tests.sim.conftest import StartEngine
from tests.sim.conftest import start_sim as start_sim
from tests.support.processes import ProcessJanitor

LIMIT = 8192


@pytest.fixture
def proxied(janitor: ProcessJanitor, start_sim: StartEngine, tmp_path: Path
            ) -> tuple[Proxy, EngineHandle]:
    """The proxy (bodies up to LIMIT bytes) straight in front of one simulated engine."""
    engine = start_sim(schedulers=1, token_interval_ms=1)
    return start_proxy(janitor, tmp_path, engine.url, "--max-body-bytes", str(LIMIT)), engine


BAD_BODIES = [
    pytest.param(b"x" * (LIMIT + 1), 413, "larger than", id="too-large"),
    pytest.param(b'{"prompt": "p"', 400, "not valid JSON", id="not-json"),
    pytest.param(b'{"prompt": "\xff"}', 400, "UTF-8", id="not-utf8"),
    pytest.param(b'{"prompt": "p", "temperature": NaN}', 400, "NaN", id="nan"),
    pytest.param(b'{"prompt": "p", "temperature": -Infinity}', 400, "Infinity", id="inf"),
    pytest.param(b'{"prompt": "p", "temperature": 1e999}', 400, "out of range", id="1e999"),
    pytest.param(b'{"prompt": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "deeper",
                 id="deep"),
    pytest.param(b"[" * 2000 + b"]" * 2000, 400, "deeper", id="very-deep"),
    pytest.param(b'{"prompt": "p", "max_tokens": 1' + b"0" * 5000 + b"}", 400, "JSON",
                 id="huge-int"),
    pytest.param(b'["prompt"]', 422, "JSON object", id="array"),
    pytest.param(b'{"prompt": "p", "max_tokens": "8"}', 422, "max_tokens", id="str-int"),
    pytest.param(b'{"prompt": "p", "stream": 1}', 422, "stream", id="int-bool"),
    pytest.param(b'{"prompt": {"a": 1}}', 422, "prompt", id="prompt-object"),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD_BODIES)
def test_bad_completion_bodies_get_a_clear_4xx(
    proxied: tuple[Proxy, EngineHandle], body: bytes, status: int, says: str
) -> None:
    """1. POST the body to /v1/completions.
    2. The answer is the expected 4xx, JSON whose ``detail`` says what is wrong."""
    proxy, _ = proxied
    answer = httpx.post(f"{proxy.url}/v1/completions", content=body, timeout=30,
                        headers={"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    assert says in answer.json()["detail"]


def test_bad_chat_bodies_and_rejections_pass_as_4xx(proxied: tuple[Proxy, EngineHandle]
                                                     ) -> None:
    """1. A chat with no messages, or messages of the wrong shape: 422 naming them.
    2. A chat the engine itself rejects (n=2): the engine's own 422 and body, relayed
       at once (a rejection is not retried)."""
    proxy, _ = proxied
    url = f"{proxy.url}/v1/chat/completions"
    bodies: list[dict[str, Any]] = [{"messages": []}, {"messages": ["hi"]}, {"model": "sim"}]
    for body in bodies:
        answer = httpx.post(url, json=body, timeout=30)
        assert answer.status_code == 422, answer.text
        assert "messages" in answer.json()["detail"]
    rejected = httpx.post(url, json={"messages": [{"role": "user", "content": "x"}], "n": 2},
                          timeout=30)
    assert rejected.status_code == 422
    assert "'n' must be 1" in rejected.json()["detail"]
    assert proxy.metrics()["continuation_proxy_upstream_retries_total"] == 0


def test_other_calls_pass_through_and_the_proxy_reports(
    proxied: tuple[Proxy, EngineHandle]
) -> None:
    """1. GET /v1/models through the proxy is the engine's own answer.
    2. An unknown path is the engine's 404.
    3. /health answers; /metrics lists every counter, each refusal reason at 0.
    4. A completion without a hand-back streams whole through the proxy."""
    proxy, engine = proxied
    models = httpx.get(f"{proxy.url}/v1/models", timeout=30)
    assert models.status_code == 200
    assert models.json() == httpx.get(f"{engine.url}/v1/models", timeout=30).json()
    assert httpx.get(f"{proxy.url}/no/such/path", timeout=30).status_code == 404
    assert httpx.get(f"{proxy.url}/health", timeout=30).json()["status"] == "ok"
    answer = httpx.post(f"{proxy.url}/v1/completions", timeout=30,
                        json={"model": "sim", "prompt": "p", "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    seen = proxy.metrics()
    for reason in ("n", "best_of", "echo", "tool_call", "reasoning"):
        assert seen[f'continuation_proxy_refused_total{{reason="{reason}"}}'] == 0
    assert seen["continuation_proxy_streams_total"] == 1
    assert seen["continuation_proxy_completed_total"] == 1
    assert seen["continuation_proxy_tokens_total"] == 3
