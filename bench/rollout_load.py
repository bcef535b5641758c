"""The rollout benchmark's clients, and how what they received is counted.

    python -m bench.rollout_load --url URL --clients N --max-tokens N --prefix P --out FILE

runs the load in a process of its own until SIGTERM, then writes every stream to ``FILE``
(JSON): the clients are apart from the benchmark's control plane (starting and deleting
pods), whose work would otherwise delay the clients' reads and show as inter-token latency.
``time.monotonic()`` is one clock for every process of the host.

``TimedLoad`` keeps ``clients`` streaming completions in flight through one URL (smg, or
the continuation proxy in front of it), each client sending its next request as soon as
its last one ended (``devstack.routers.RouterLoad``), and records every token's arrival. ``tally``
turns the streams into the table's numbers, held against the engine's deterministic tokens
(``expected_tokens(prompt, n)``): the client's stitched text, token by token.

How a stream counts (``Received.outcome``):

- ``failed``: the client got none of it: an HTTP status other than 200, or the connection or
  an error event ended it before its first token;
- ``cut``: it started but did not end with ``[DONE]``: the engine's handed-back event
  reached the client (even before any token), an error event or a broken connection came
  after some tokens, or the body ended without ``[DONE]``;
- ``done``: ``[DONE]`` came (its tokens may still be wrong: that is lost and duplicated).

Tokens lost and duplicated are counted on every request sent, failed ones included (a
failed request lost all of its tokens): the received tokens are aligned with the expected
ones (``difflib``, longest matching blocks), lost = expected - matched, duplicated =
received - matched.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack.routers import RouterLoad, SentStream
from devstack.sim.tokens import expected_tokens


@dataclass
class Received:
    """One streaming completion a client sent, and what came back."""

    request_id: str
    prompt: str
    max_tokens: int
    sent_at: float
    """``time.monotonic()`` just before the request left."""
    texts: list[str] = field(default_factory=list)
    """Each content chunk's text, in order of arrival."""
    times: list[float] = field(default_factory=list)
    """``time.monotonic()`` of each chunk's arrival."""
    end: str | None = None
    """``done``, ``handed_back``, ``error`` (status, error event, broken or unfinished
    stream); None while it runs."""
    error: str | None = None
    ended_at: float | None = None

    def tokens(self) -> list[str]:
        """The stitched text as the engine's tokens (each is ``" " + word``)."""
        return [" " + word for word in "".join(self.texts).split(" ")[1:]]

    def expected(self) -> list[str]:
        return expected_tokens(self.prompt, self.max_tokens)

    @property
    def outcome(self) -> str:
        if self.end == "done":
            return "done"
        # A handed-back stream started (200, then the engine's event), even with no token.
        return "cut" if self.texts or self.end == "handed_back" else "failed"

    def damage(self) -> tuple[int, int]:
        """(lost, duplicated) tokens against the expected ones."""
        want, got = self.expected(), self.tokens()
        matcher = difflib.SequenceMatcher(a=want, b=got, autojunk=False)
        matched = sum(block.size for block in matcher.get_matching_blocks())
        return len(want) - matched, len(got) - matched

    def gaps(self) -> list[float]:
        """Seconds between consecutive chunks (the inter-token latencies)."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


class _Arrivals(list[str]):
    """A stream's chunk texts, each noting when it arrived (``time.monotonic()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, text: str) -> None:
        self.times.append(time.monotonic())
        super().append(text)


class TimedLoad(RouterLoad):
    """``devstack.routers.RouterLoad`` (``clients`` streams at a time through ``url``, back to
    back, until ``stop()``; request ``i`` is ``X-Request-Id: {prefix}-{i}`` with a prompt of
    its own), with each request's send and every chunk's arrival timed: ``received``."""

    def __init__(self, url: str, *, clients: int, max_tokens: int, prefix: str) -> None:
        super().__init__(url, clients=clients, max_tokens=max_tokens, prefix=prefix)
        self.received: list[Received] = []

    async def _one(self, http: httpx.AsyncClient, stream: SentStream) -> None:
        arrivals = _Arrivals()
        stream.tokens = arrivals
        sent_at = time.monotonic()
        try:
            await super()._one(http, stream)
        finally:
            # Chunks without text (a role-only first chunk, say) are no tokens.
            kept = [(text, at) for text, at in zip(arrivals, arrivals.times, strict=True)
                    if text]
            why = stream.error or (str(stream.handed_back) if stream.handed_back else None)
            self.received.append(Received(
                stream.request_id, stream.prompt, stream.max_tokens, sent_at,
                [text for text, _ in kept], [at for _, at in kept], stream.end or "error",
                why, time.monotonic()))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0-100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Tally:
    """What a set of streams adds up to."""

    streams: int
    done: int
    failed: int
    cut: int
    lost: int
    duplicated: int
    ttft_ms: tuple[float | None, float | None]
    """p50, p99 time to first token."""
    itl_ms: tuple[float | None, float | None]
    """p50, p99 inter-token latency."""
    itl_samples: int
    errors: list[str] = field(default_factory=list)
    """A few of the failures and cuts, for the report."""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def tally(streams: Sequence[Received]) -> Tally:
    """Count ``streams`` (see the module's docstring for what counts as what)."""
    damage = [s.damage() for s in streams]
    ttft = [(s.times[0] - s.sent_at) * 1000 for s in streams if s.times]
    itl = [gap * 1000 for s in streams for gap in s.gaps()]
    bad = [f"{s.request_id}: {s.outcome} after {len(s.texts)} chunks: {s.error}"
           for s in streams if s.outcome != "done"]
    return Tally(
        streams=len(streams),
        done=sum(s.outcome == "done" for s in streams),
        failed=sum(s.outcome == "failed" for s in streams),
        cut=sum(s.outcome == "cut" for s in streams),
        lost=sum(lost for lost, _ in damage),
        duplicated=sum(dup for _, dup in damage),
        ttft_ms=(percentile(ttft, 50), percentile(ttft, 99)),
        itl_ms=(percentile(itl, 50), percentile(itl, 99)),
        itl_samples=len(itl),
        errors=bad[:5],
    )


def slow_gaps(streams: Sequence[Received], threshold_ms: float,
              windows: Sequence[tuple[float, float]]) -> tuple[int, int]:
    """How many inter-token gaps exceed ``threshold_ms``, and how many of those overlap one
    of ``windows`` (``time.monotonic()`` intervals: new pods starting, say)."""
    slow = [(a, b) for s in streams for a, b in zip(s.times, s.times[1:], strict=False)
            if (b - a) * 1000 > threshold_ms]
    inside = sum(any(a < end and b > start for start, end in windows) for a, b in slow)
    return len(slow), inside


def handover_gaps(streams: Sequence[Received], requests: Sequence[dict[str, Any]]) -> list[float]:
    """Milliseconds between the last token before each hand-back an engine logged and the
    first token after it, in the client's stream (a continued stream's stitch). The
    continuation proxy names its attempts ``ID.0``, ``ID.1``, ...; a stream not continued
    has no token after its hand-back and adds nothing."""
    by_id = {s.request_id: s for s in streams}
    stitches: dict[tuple[str, int], float] = {}  # a retried continuation: one stitch
    for record in requests:
        stream = by_id.get(str(record["request_id"]).rsplit(".", 1)[0])
        if record["how"] != "handed_back" or stream is None:
            continue
        after = [i for i, t in enumerate(stream.times) if t >= record["ended_at_monotonic"]]
        if after and after[0] > 0:
            i = after[0]
            stitches[(stream.request_id, i)] = (stream.times[i] - stream.times[i - 1]) * 1000
    return list(stitches.values())


def read_streams(path: Path) -> list[Received]:
    """The streams a load process wrote (``main``)."""
    return [Received(**item) for item in json.loads(path.read_text())]


async def _run_until_sigterm(load: TimedLoad, out: Path) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, load.stop)
    await load.run()
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps([asdict(s) for s in load.received]))
    os.replace(tmp, out)  # the benchmark reads it whole or not at all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout_load",
                                     description="Streams back to back until SIGTERM.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    load = TimedLoad(args.url, clients=args.clients, max_tokens=args.max_tokens,
                     prefix=args.prefix)
    asyncio.run(_run_until_sigterm(load, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
