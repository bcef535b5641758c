"""The price of not moving the KV cache: what a continued stream costs the pod that takes it
over (the re-prefill of the context already streamed), on real vLLM and real SGLang on this
CPU, against a fresh request in the same run.

    ENGINES_DIR=/work/engines .venv/bin/python -m bench.reprefill [--engines vllm sglang]
        [--lengths 0 256 1024 2048 4096] [--repeats 7] [--prompt-tokens 32]
        [--decode-tokens 64] [--layers N --hidden H] [--json FILE] [--keep DIR]

Each engine is started once (one at a time) with the tiny Llama (dummy weights), its prefix
cache as the engine ships it (on, for both: read back from its log), room for the longest
context (``--layers``/``--hidden`` make it deeper and wider, the rest as it is). Then:

1. One prompt per repeat, and one more to warm up, each with a word of its own first, so no
   two share a cached block. Each is streamed once through the continuation proxy's own first
   body (``first_body``: greedy, ``return_token_ids``) for max(lengths) + 1 tokens: the chunks
   the engine really sent.
2. For each length L: the chunks up to the first boundary at or after L tokens (a stream
   breaks between chunks; the context column says where) go through the proxy's
   ``Stitcher`` as a stream cut there, of an original request for one token more, and
   ``continuation_body`` makes the request the proxy sends to continue it (for the one token
   left): the prompt's token ids and those streamed where the engine gave both, else text.
   L = 0 is the original request itself: the fresh request, the baseline. One more request
   per round, the fresh request for 1 + ``--decode-tokens`` tokens, gives the engine's
   decode time per token.
3. Every request once with the warm-up prompt (not counted), then ``--repeats`` rounds, each
   going through the requests in an order rotated by one from the round before, so the
   machine's drift falls on every length alike. Before each request the engine's prefix cache
   is emptied (vLLM's ``/reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``;
   SGLang's ``/flush_cache``; both refuse while a request still holds blocks, so this also
   waits for the engine to be idle): the cache of a pod that never saw the stream. The
   engine's own count of prefix-cache hits (``vllm:prefix_cache_hits``,
   ``sglang:cached_tokens``) is read around each request; a request that hit is reported.
4. Per request, by the client's clock: send → first SSE token (TTFT) and send → ``[DONE]``;
   the token continued is compared with the one the original stream had at the same place
   (greedy: the same, unless batching changed a sum).
5. Per L: TTFT median and p90, the ratio to the fresh request's median, the TTFT in tokens'
   worth of decode time (the decode requests' median time to ``[DONE]`` less the fresh
   requests', per token), the time it adds to a fresh request. The 1-minute load average is
   sampled every 2 s while requests are measured.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.drain_rig import pct
from router_client.openai_requests import (
    COMPLETIONS,
    continuation_body,
    first_body,
    wants_exact,
)
from router_client.stitching import Stitcher
from tests.engines.sglang_stack import ENGINE_FLAGS, start_sglang
from tests.engines.stack import start_vllm
from tests.engines.tiny_model import WORDS, write_tiny_model
from tests.support.processes import ProcessJanitor, wait_for

HIT_COUNTERS = {"vllm": "vllm:prefix_cache_hits", "sglang": "sglang:cached_tokens"}
"""Each engine's count of prompt tokens served from its prefix cache (Prometheus)."""
PREFIX_CACHE_LOG = {"vllm": r"\benable_prefix_caching'?\s*[=:]\s*(\w+)",
                    "sglang": r"\bdisable_radix_cache'?\s*[=:]\s*(\w+)"}
"""Where each engine's log says whether its prefix cache is on (SGLang's says if it is off)."""
HEAD_DIM = 32
"""The tiny model's (vLLM's CPU attention needs at least 32)."""


# -- pure parts ----------------------------------------------------------------------------


def prompt_for(index: int, words: int) -> str:
    """Prompt ``index``: its own filler word ``w<index>`` first, then in-vocabulary words."""
    return " ".join([f"w{index}", *(WORDS[i % len(WORDS)] for i in range(words - 1))])


def cut_after(first: dict[str, Any], chunks: Sequence[dict[str, Any]],
              tokens: int) -> dict[str, Any]:
    """The request the continuation proxy sends for ``first`` (its first attempt's body) when
    the stream broke after ``tokens`` tokens of ``chunks`` (the first attempt's events, in
    order): the chunks go through the proxy's ``Stitcher`` until that many tokens came."""
    if tokens == 0:
        return dict(first)
    stitcher = Stitcher(COMPLETIONS, keep_token_ids=False,
                        use_token_ids=wants_exact(COMPLETIONS, first))
    for chunk in chunks:
        stitcher.take(copy.deepcopy(chunk))
        if stitcher.sent >= tokens:
            break
    if stitcher.sent != tokens:
        raise ValueError(f"the stream has no cut after {tokens} tokens ({stitcher.sent})")
    stitcher.end_attempt(None)
    return continuation_body(COMPLETIONS, first, stitcher.streamed())


def boundary(chunks: Sequence[dict[str, Any]], tokens: int) -> int:
    """The first chunk boundary at or after ``tokens`` tokens: a stream breaks between chunks,
    and an engine that falls behind its client sends several tokens in one (vLLM merges the
    outputs a slow reader has not taken yet)."""
    seen = 0
    for chunk in chunks:
        if seen >= tokens:
            return seen
        seen += len(chunk_ids([chunk]))
    if seen >= tokens:
        return seen
    raise ValueError(f"the stream has {seen} < {tokens} tokens")


def chunk_ids(chunks: Sequence[dict[str, Any]]) -> list[int]:
    """Choice 0's output token ids across ``chunks``."""
    out: list[int] = []
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                out += choice.get("token_ids") or []
    return out


def counter(metrics: str, name: str) -> float:
    """The sum of every sample of counter ``name`` (``name_total``, any labels) in a
    Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})?\s+(\S+)", re.M)
    return sum(float(value) for value in pattern.findall(metrics))


DECODE = -1
"""The slot of a round that measures decode: the fresh request, for 1 + decode tokens."""


def rounds(slots: Sequence[int], repeats: int) -> Iterator[tuple[int, int]]:
    """(repeat, slot) in measuring order: round r starts at the r-th slot (rotated)."""
    for r in range(repeats):
        for i in range(len(slots)):
            yield r, slots[(r + i) % len(slots)]


@dataclass
class Sample:
    """One measured request."""

    length: int
    """Tokens streamed before it (0: the fresh request; ``DECODE``: the decode request)."""
    repeat: int
    context: int
    """Prompt tokens the engine prefilled (the prompt and the L streamed)."""
    ttft_s: float
    total_s: float
    """Send → ``[DONE]``."""
    tokens: int
    exact: bool
    """The tokens generated are the ones the original stream had there."""
    cache_hits: float
    by_ids: bool


@dataclass
class Row:
    length: int
    context: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    vs_fresh: float
    decode_tokens: float
    added_ms: float
    n: int
    exact: int
    hits: float


def decode_s(samples: Sequence[Sample], tokens: int) -> float:
    """Decode time per token: the decode requests' median send → ``[DONE]`` less the fresh
    requests' (the same prompt, 1 token), over the ``tokens`` more they generated."""
    fresh = pct([s.total_s for s in samples if s.length == 0], 0.5)
    longer = pct([s.total_s for s in samples if s.length == DECODE], 0.5)
    return (longer - fresh) / tokens


def table_rows(samples: Sequence[Sample], decode_tokens: int) -> list[Row]:
    """Per length: the TTFT's median and p90, against the fresh request's (length 0) median
    TTFT and the decode time per token."""
    fresh = [s for s in samples if s.length == 0]
    if not fresh:
        raise ValueError("no fresh request (length 0) to hold the others against")
    fresh_ttft = pct([s.ttft_s for s in fresh], 0.5)
    decode = decode_s(samples, decode_tokens)
    rows = []
    for length in sorted({s.length for s in samples} - {DECODE}):
        mine = [s for s in samples if s.length == length]
        p50 = pct([s.ttft_s for s in mine], 0.5)
        rows.append(Row(
            length=length, context=round(pct([s.context for s in mine], 0.5)),
            ttft_p50_ms=p50 * 1e3, ttft_p90_ms=pct([s.ttft_s for s in mine], 0.9) * 1e3,
            vs_fresh=p50 / fresh_ttft, decode_tokens=p50 / decode,
            added_ms=(p50 - fresh_ttft) * 1e3, n=len(mine),
            exact=sum(s.exact for s in mine), hits=sum(s.cache_hits for s in mine)))
    return rows


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| streamed L | context (tokens) | TTFT p50 ms | TTFT p90 ms | vs fresh "
             "| in decode tokens | added ms | token-exact | cache hits |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r.length} | {r.context} | {r.ttft_p50_ms:.1f} | {r.ttft_p90_ms:.1f} "
            f"| {r.vs_fresh:.2f} | {r.decode_tokens:.1f} | {r.added_ms:+.1f} "
            f"| {r.exact}/{r.n} | {r.hits:g} |")
    return "\n".join(lines)


def write_model(directory: Path, layers: int | None, hidden: int | None) -> Path:
    """The tiny Llama, made deeper or wider when asked (its vocabulary and dummy weights as
    they are: the prefill's cost per token grows with the layers and the width)."""
    write_tiny_model(directory)
    if layers is None and hidden is None:
        return directory
    config = json.loads((directory / "config.json").read_text())
    width = hidden or config["hidden_size"]
    config.update(num_hidden_layers=layers or config["num_hidden_layers"], hidden_size=width,
                  intermediate_size=2 * width, num_attention_heads=width // HEAD_DIM,
                  num_key_value_heads=width // HEAD_DIM, head_dim=HEAD_DIM)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def describe(model: Path) -> str:
    config = json.loads((model / "config.json").read_text())
    return (f"the tiny Llama: {config['num_hidden_layers']} layer(s), hidden "
            f"{config['hidden_size']}, dummy weights")


# -- the engines ---------------------------------------------------------------------------


@dataclass
class Engine:
    name: str
    url: str
    model: str
    log: Path
    reset: Callable[[httpx.Client], bool]
    """Empty the prefix cache; False while the engine refuses (a request holds blocks)."""

    def prefix_cache(self) -> str:
        """Whether the prefix cache is on, as the engine's own log says."""
        found = re.search(PREFIX_CACHE_LOG[self.name], self.log.read_text(errors="replace"))
        if found is None:
            return "not in its log"
        on = found.group(1) == "True"
        return "on" if on != (self.name == "sglang") else "off"


def start_engine(name: str, janitor: ProcessJanitor, tmp: Path, model: Path,
                 context: int) -> Engine:
    if name == "vllm":
        vllm = start_vllm(janitor, tmp, model, max_model_len=context,
                          extra_env={"VLLM_SERVER_DEV_MODE": "1"})
        return Engine(name, vllm.url, vllm.served_model, vllm.log, lambda http: http.post(
            vllm.url + "/reset_prefix_cache").json().get("success") is True)
    flags = tuple(f for f in ENGINE_FLAGS if f != "--disable-radix-cache")
    sglang = start_sglang(janitor, tmp, model, engine_flags=flags)
    return Engine(name, sglang.url, sglang.model, sglang.log,
                  lambda http: http.post(sglang.url + "/flush_cache").status_code == 200)


@dataclass
class Received:
    chunks: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    """(perf_counter, tokens) of each chunk that carried tokens."""
    done: bool = False


def stream(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, Received]:
    """POST ``body`` streamed; (its send time, what came)."""
    out = Received()
    sent = time.perf_counter()
    with http.stream("POST", url + COMPLETIONS, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                out.done = True
                break
            event = json.loads(data)
            out.chunks.append(event)
            got = len(chunk_ids([event])) or sum(
                bool(c.get("text")) for c in event.get("choices") or ())
            if got:
                out.arrivals.append((time.perf_counter(), got))
    return sent, out


def hits(http: httpx.Client, engine: Engine) -> float:
    return counter(http.get(engine.url + "/metrics").text, HIT_COUNTERS[engine.name])


def hit_control(http: httpx.Client, engine: Engine, body: dict[str, Any]) -> float:
    """The hit counter seen to move: ``body`` sent twice, the cache emptied only before the
    first; the second's hits (a counter that did not move would hide a hit)."""
    wait_for(lambda: engine.reset(http), timeout=120, interval=0.05,
             what=f"{engine.name} empties its prefix cache")
    stream(http, engine.url, body)
    before = hits(http, engine)
    stream(http, engine.url, body)
    moved = hits(http, engine) - before
    if moved <= 0:
        raise RuntimeError(f"{engine.name}: a repeated request moved no prefix-cache hit "
                           f"counter ({HIT_COUNTERS[engine.name]}): misses cannot be told")
    return moved


def measure(http: httpx.Client, engine: Engine, body: dict[str, Any], expected: list[int],
            length: int, repeat: int) -> Sample:
    wait_for(lambda: engine.reset(http), timeout=120, interval=0.05,
             what=f"{engine.name} empties its prefix cache")
    before = hits(http, engine)
    sent, got = stream(http, engine.url, body)
    done = time.perf_counter()
    cache_hits = hits(http, engine) - before
    if not got.done or not got.arrivals:
        raise RuntimeError(f"{engine.name}: L={length} ended without [DONE] or tokens")
    prompt = body["prompt"]
    context = len(prompt) if isinstance(prompt, list) else len(prompt.split())
    ids = chunk_ids(got.chunks)
    return Sample(length=length, repeat=repeat, context=context,
                  ttft_s=got.arrivals[0][0] - sent, total_s=done - sent, tokens=len(ids),
                  exact=ids == expected, cache_hits=cache_hits, by_ids=isinstance(prompt, list))


class LoadSampler:
    """The 1-minute load average every ``interval`` seconds, from a thread."""

    def __init__(self, interval: float = 2.0) -> None:
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.values.append(os.getloadavg()[0])
            self._stop.wait(interval)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def describe(self) -> str:
        v = self.values
        return (f"{min(v):.1f}-{max(v):.1f} (median {pct(v, 0.5):.1f}, {len(v)} readings)"
                if v else "not read")


def run_engine(name: str, args: argparse.Namespace, tmp: Path, model: Path) -> dict[str, Any]:
    lengths = sorted(set(args.lengths) | {0})
    longest = max(max(lengths) + 1, 1 + args.decode_tokens)
    janitor = ProcessJanitor()
    try:
        (tmp / name).mkdir(parents=True, exist_ok=True)
        engine = start_engine(name, janitor, tmp / name, model,
                              args.prompt_tokens + longest + 64)
        prompts = [prompt_for(i, args.prompt_tokens) for i in range(args.repeats + 1)]
        originals = [{"model": engine.model, "prompt": p, "temperature": 0, "stream": True}
                     for p in prompts]
        with httpx.Client(timeout=httpx.Timeout(900, connect=30)) as http:
            # 1. What the engine really streams for each prompt, all at once.
            with ThreadPoolExecutor(len(prompts)) as pool:
                whole = list(pool.map(lambda o: stream(http, engine.url, first_body(
                    COMPLETIONS, {**o, "max_tokens": longest}, ask_token_ids=True))[1],
                    originals))
            for w in whole:
                if len(chunk_ids(w.chunks)) < longest:
                    raise RuntimeError(f"{name}: a stream ended after "
                                       f"{len(chunk_ids(w.chunks))} < {longest} tokens")

            def request(r: int, slot: int) -> tuple[dict[str, Any], list[int]]:
                """2. Slot ``slot`` of round ``r``: its body and the tokens it must give."""
                ids = chunk_ids(whole[r].chunks)
                if slot == DECODE:
                    return first_body(COMPLETIONS, {
                        **originals[r], "max_tokens": 1 + args.decode_tokens},
                        ask_token_ids=True), ids[:1 + args.decode_tokens]
                cut = boundary(whole[r].chunks, slot)
                first = first_body(COMPLETIONS, {**originals[r], "max_tokens": cut + 1},
                                   ask_token_ids=True)
                return cut_after(first, whole[r].chunks, cut), ids[cut:cut + 1]

            # 3. Warm-up (the last prompt), then the measured rounds.
            slots = [*lengths, DECODE]
            for slot in slots:
                measure(http, engine, *request(args.repeats, slot), slot, args.repeats)
            control = hit_control(http, engine, request(args.repeats, max(lengths))[0])
            samples = []
            with LoadSampler() as load:
                for r, slot in rounds(slots, args.repeats):
                    samples.append(measure(http, engine, *request(r, slot), slot, r))
        rows = table_rows(samples, args.decode_tokens)
        return {"engine": name, "model": describe(model), "prefix_cache": engine.prefix_cache(),
                "control_hits": control,
                "by_ids": all(s.by_ids for s in samples if s.length > 0),
                "decode_ms": decode_s(samples, args.decode_tokens) * 1e3,
                "load": load.describe(), "loads": load.values,
                "rows": [asdict(r) for r in rows], "samples": [asdict(s) for s in samples]}
    finally:
        janitor.close()


def report(result: dict[str, Any]) -> str:
    rows = [Row(**r) for r in result["rows"]]
    by = "token ids" if result["by_ids"] else "text"
    return "\n".join([
        f"### {result['engine']}, {result['model']}",
        "",
        f"prefix cache: {result['prefix_cache']} (the engine's default), emptied before each "
        f"request (the same request sent twice hit {result['control_hits']:g} tokens); "
        f"continued by {by}; fresh request: TTFT {rows[0].ttft_p50_ms:.1f} ms; decode "
        f"{result['decode_ms']:.2f} ms/token; 1-minute load average while measured: "
        f"{result['load']}",
        "",
        markdown(rows),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines", nargs="+", choices=("vllm", "sglang"),
                        default=["vllm", "sglang"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[0, 256, 1024, 2048, 4096],
                        help="tokens already streamed when the stream is continued")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=64,
                        help="tokens the decode request generates after its first")
    parser.add_argument("--layers", type=int, default=None,
                        help="a model this deep instead of the tiny one's single layer")
    parser.add_argument("--hidden", type=int, default=None,
                        help="a model this wide instead of the tiny one's 64 (heads of 32)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the engines' logs under this directory")
    args = parser.parse_args()
    if min(args.lengths) < 0 or min(args.repeats, args.decode_tokens, args.prompt_tokens) < 1:
        parser.error("lengths >= 0; repeats, decode-tokens, prompt-tokens >= 1")
    if (args.layers is not None and args.layers < 1) or (
            args.hidden is not None and (args.hidden < HEAD_DIM or args.hidden % HEAD_DIM)):
        parser.error(f"--layers >= 1; --hidden a multiple of {HEAD_DIM}")
    results = []
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-reprefill-")))
        else:
            tmp = args.keep
            tmp.mkdir(parents=True, exist_ok=True)
        model = write_model(tmp / "model", args.layers, args.hidden)
        for name in args.engines:
            results.append(run_engine(name, args, tmp, model))
            print(report(results[-1]), "\n", flush=True)
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
