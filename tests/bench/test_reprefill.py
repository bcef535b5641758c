"""``bench/reprefill.py``'s pure parts: the request it times is the continuation proxy's own
for a stream cut after L tokens, the engines' hit counters are read whole, the rounds rotate,
and the table's ratios are the samples' (made-up numbers, checked by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reprefill import (
    DECODE,
    Sample,
    boundary,
    counter,
    cut_after,
    decode_s,
    describe,
    prompt_for,
    rounds,
    table_rows,
    write_model,
)
from router_client.openai_requests import COMPLETIONS, first_body


def chunk(text: str, ids: list[int], prompt_ids: list[int] | None = None) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "text": text, "token_ids": ids,
                                 "finish_reason": None}
    if prompt_ids is not None:
        choice["prompt_token_ids"] = prompt_ids
    return {"id": "cmpl-1", "created": 7, "object": "text_completion", "choices": [choice]}


CHUNKS = [chunk(" fox", [10], prompt_ids=[1, 2, 3]), chunk(" dog", [11]), chunk(" over", [12]),
          chunk(" lazy", [13])]


def first(max_tokens: int) -> dict[str, object]:
    return first_body(COMPLETIONS, {"model": "tiny", "prompt": "w0 the quick",
                                    "max_tokens": max_tokens, "temperature": 0,
                                    "stream": True}, ask_token_ids=True)


def test_the_fresh_request_is_the_original() -> None:
    assert cut_after(first(1), CHUNKS, 0) == first(1)


def test_a_cut_stream_is_continued_by_the_prompt_ids_and_the_streamed_ids() -> None:
    body = cut_after(first(3), CHUNKS, 2)
    assert body["prompt"] == [1, 2, 3, 10, 11]
    assert body["max_tokens"] == 1
    assert body["return_token_ids"] is True
    assert CHUNKS[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3]  # type: ignore[index]


def test_without_the_prompt_ids_it_is_continued_by_text() -> None:
    chunks = [chunk(" fox", [10]), chunk(" dog", [11])]
    assert cut_after(first(3), chunks, 2)["prompt"] == "w0 the quick fox dog"


def test_a_length_the_stream_never_reached_is_refused() -> None:
    with pytest.raises(ValueError, match="no cut after 5 tokens"):
        cut_after(first(6), CHUNKS, 5)


def test_counters_sum_every_labelled_sample_and_ignore_lookalikes() -> None:
    metrics = "\n".join([
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 48.0',
        'vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 16.0',
        'vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7e9',
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 900.0',
        "sglang:cached_tokens_total 3",
    ])
    assert counter(metrics, "vllm:prefix_cache_hits") == 64.0
    assert counter(metrics, "sglang:cached_tokens") == 3.0
    assert counter(metrics, "sglang:cached_tokens_details") == 0.0


def test_rounds_rotate_so_every_slot_is_measured_at_every_place() -> None:
    order = list(rounds([0, 256, DECODE], 3))
    assert order == [(0, 0), (0, 256), (0, DECODE), (1, 256), (1, DECODE), (1, 0),
                     (2, DECODE), (2, 0), (2, 256)]


def test_prompts_differ_from_their_first_token() -> None:
    prompts = [prompt_for(i, 8) for i in range(3)]
    assert len({p.split()[0] for p in prompts}) == 3
    assert all(len(p.split()) == 8 for p in prompts)


def sample(length: int, ttft_ms: float, total_ms: float) -> Sample:
    return Sample(length=length, repeat=0, context=32 + max(length, 0), ttft_s=ttft_ms / 1e3,
                  total_s=total_ms / 1e3, tokens=1, exact=True, cache_hits=0.0, by_ids=True)


def test_the_table_holds_each_length_against_the_fresh_request_and_decode() -> None:
    samples = [sample(0, 10, 12), sample(0, 20, 22), sample(0, 30, 32),
               sample(DECODE, 10, 72), sample(DECODE, 10, 82), sample(DECODE, 10, 92),
               sample(1024, 40, 42), sample(1024, 50, 52), sample(1024, 90, 92)]
    # Decode: (82 - 22) ms over 10 more tokens.
    assert decode_s(samples, 10) == pytest.approx(0.006)
    rows = table_rows(samples, 10)
    assert [r.length for r in rows] == [0, 1024]
    fresh, long = rows
    assert (fresh.ttft_p50_ms, fresh.vs_fresh, fresh.added_ms) == pytest.approx((20, 1, 0))
    assert long.context == 1056
    assert long.ttft_p50_ms == pytest.approx(50)
    assert long.ttft_p90_ms == pytest.approx(90)
    assert long.vs_fresh == pytest.approx(2.5)
    assert long.decode_tokens == pytest.approx(50 / 6)
    assert long.added_ms == pytest.approx(30)
    assert (long.n, long.exact, long.hits) == (3, 3, 0)


def test_a_table_without_a_fresh_request_is_refused() -> None:
    with pytest.raises(ValueError, match="no fresh request"):
        table_rows([sample(256, 1, 2)], 10)


def test_a_larger_model_keeps_the_tiny_ones_head_size_and_vocabulary(tmp_path: Path) -> None:
    tiny = json.loads((write_model(tmp_path / "tiny", None, None) / "config.json").read_text())
    model = write_model(tmp_path / "big", 4, 256)
    config = json.loads((model / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (4, 256)
    assert config["num_attention_heads"] * config["head_dim"] == 256
    assert config["head_dim"] == tiny["head_dim"]
    assert config["vocab_size"] == tiny["vocab_size"]
    assert describe(model) == "the tiny Llama: 4 layer(s), hidden 256, dummy weights"


def test_a_stream_is_cut_at_the_first_chunk_boundary_at_or_after_the_length() -> None:
    merged = [chunk(" fox", [10], prompt_ids=[1, 2, 3]), chunk(" dog over lazy", [11, 12, 13]),
              chunk(" the", [14])]
    assert [boundary(merged, n) for n in (0, 1, 2, 4, 5)] == [0, 1, 4, 4, 5]
    with pytest.raises(ValueError, match="5 < 6 tokens"):
        boundary(merged, 6)
    assert cut_after(first(5), merged, 4)["prompt"] == [1, 2, 3, 10, 11, 12, 13]
