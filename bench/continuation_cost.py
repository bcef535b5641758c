"""What the continuation layer costs: the same streaming load straight to a real router and
through ``continuation_proxy`` in front of it, side by side in one run.

    .venv/bin/python -m bench.continuation_cost [--router smg] [--streams 64] [--seconds 15]

1. Three simulated pods behind the router (``LocalStack.start_routed_pods``; the router's
   adapters off: nothing drains here), and the proxy in front of the router.
2. ``--streams`` clients, each streaming one completion after another, for ``--seconds``
   per phase; the phases alternate direct, proxy, proxy, direct, ... (``--rounds`` each), so
   the machine's drift falls on both sides alike.
3. For every stream: time to the first token from the request's send, and the gaps between
   its tokens (inter-token latency), by the client's own clock when each SSE line arrived;
   every stream must be the engines' exact tokens, else the run is void.
4. Per side: p50/p99 of both, tokens per second, and the proxy's CPU (``/proc/<pid>/stat``
   utime + stime over its phases) per 1,000 tokens it carried.

The goals (issue 13): added p99 inter-token latency ≤ 1 ms, throughput ratio ≥ 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.drain_rig import pct
from devstack.local_stack import LocalStack, RoutedFleet
from devstack.sim.tokens import expected_tokens
from router_client import sse

TOKENS = 40
"""Tokens per stream."""
TOKEN_INTERVAL_MS = 50
"""The engines' decode pace: 20 tokens a second per stream, an LLM's usual order."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Stream:
    """One streamed completion, as the client saw it."""

    prompt: str
    sent: float
    arrivals: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    done: bool = False

    @property
    def exact(self) -> bool:
        return self.done and self.tokens == expected_tokens(self.prompt, TOKENS)


@dataclass
class Phase:
    """One side's streams over one phase."""

    side: str
    streams: list[Stream]
    seconds: float
    proxy_cpu_s: float | None = None


async def _client(http: httpx.AsyncClient, url: str, stop: asyncio.Event, streams: list[Stream],
                  name: str) -> None:
    n = 0
    while not stop.is_set():
        stream = Stream(f"{name}-{n}: what does a drain cost", time.monotonic())
        n += 1
        streams.append(stream)
        body = {"model": "sim", "prompt": stream.prompt, "max_tokens": TOKENS, "stream": True}
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                continue
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                arrived = time.monotonic()
                data = line[5:].strip()
                if data == sse.DONE:
                    stream.done = True
                    break
                event = json.loads(data)
                stream.tokens.append(sse.chunk_text(event))
                stream.arrivals.append(arrived)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


async def run_phase(side: str, url: str, clients: int, seconds: float,
                    proxy_pid: int | None) -> Phase:
    """``clients`` streams at a time to ``url`` for ``seconds``, then the ones in flight to
    their end; the proxy's CPU over the whole phase when ``proxy_pid`` is given."""
    stop = asyncio.Event()
    streams: list[Stream] = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    cpu0 = _cpu_s(proxy_pid) if proxy_pid else 0.0
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as http:
        tasks = [asyncio.create_task(_client(http, url, stop, streams, f"{side}{i}"))
                 for i in range(clients)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
    phase = Phase(side, streams, time.monotonic() - started)
    if proxy_pid:
        phase.proxy_cpu_s = _cpu_s(proxy_pid) - cpu0
    return phase


@dataclass
class Side:
    """Every phase of one side, pooled."""

    phases: list[Phase]

    @property
    def streams(self) -> list[Stream]:
        return [s for p in self.phases for s in p.streams]

    def ttft_ms(self) -> list[float]:
        return [(s.arrivals[0] - s.sent) * 1000 for s in self.streams if s.arrivals]

    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000 for s in self.streams
                for a, b in zip(s.arrivals, s.arrivals[1:], strict=False)]

    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.streams)

    def tokens_per_s(self) -> float:
        return self.tokens() / sum(p.seconds for p in self.phases)

    def inexact(self) -> int:
        return sum(1 for s in self.streams if not s.exact)

    def cpu_per_1000_tokens_ms(self) -> float | None:
        cpu = [p.proxy_cpu_s for p in self.phases if p.proxy_cpu_s is not None]
        return 1000 * sum(cpu) / self.tokens() * 1000 if cpu and self.tokens() else None


def start_proxy(stack: LocalStack, upstream: str) -> tuple[str, int]:
    """The continuation proxy in front of ``upstream``; its URL and pid (its ready file)."""
    url = stack.start_continuation_proxy(upstream)
    return url, int(json.loads((stack.workdir / "proxy.json").read_text())["pid"])


def report(direct: Side, proxy: Side, args: argparse.Namespace) -> str:
    def row(name: str, a: float, b: float, unit: str, diff: bool) -> str:
        change = f"{b - a:+.2f} {unit}" if diff else f"{b / a:.3f}x"
        return f"{name:<34} {a:>10.2f} {b:>10.2f}   {change}"

    d_itl, p_itl = direct.itl_ms(), proxy.itl_ms()
    d_ttft, p_ttft = direct.ttft_ms(), proxy.ttft_ms()
    added_p99 = pct(p_itl, 0.99) - pct(d_itl, 0.99)
    ratio = proxy.tokens_per_s() / direct.tokens_per_s()
    cpu = proxy.cpu_per_1000_tokens_ms()
    lines = [
        f"continuation layer cost: {args.streams} streams of {TOKENS} tokens at "
        f"{TOKEN_INTERVAL_MS} ms/token, 3 simulated pods behind {args.router}; "
        f"{args.rounds} x {args.seconds:g} s per side; load average "
        f"{os.getloadavg()[0]:.2f}",
        f"{'measure':<34} {'direct':>10} {'proxy':>10}   proxy vs direct",
        row("time to first token p50 (ms)", pct(d_ttft, 0.5), pct(p_ttft, 0.5), "ms", True),
        row("time to first token p99 (ms)", pct(d_ttft, 0.99), pct(p_ttft, 0.99), "ms", True),
        row("inter-token latency p50 (ms)", pct(d_itl, 0.5), pct(p_itl, 0.5), "ms", True),
        row("inter-token latency p99 (ms)", pct(d_itl, 0.99), pct(p_itl, 0.99), "ms", True),
        row("throughput (tokens/s)", direct.tokens_per_s(), proxy.tokens_per_s(), "", False),
        f"{'streams (not exact)':<34} {len(direct.streams):>6} ({direct.inexact()}) "
        f"{len(proxy.streams):>6} ({proxy.inexact()})",
        f"{'proxy CPU per 1,000 tokens (ms)':<34} {'':>10} "
        f"{cpu if cpu is not None else float('nan'):>10.1f}",
        f"goal added p99 ITL <= 1 ms: {'met' if added_p99 <= 1.0 else 'NOT met'} "
        f"({added_p99:+.2f} ms); goal throughput ratio >= 0.95: "
        f"{'met' if ratio >= 0.95 else 'NOT met'} ({ratio:.3f})",
    ]
    return "\n".join(lines)


async def measure(args: argparse.Namespace, workdir: Path) -> tuple[Side, Side]:
    """Steps 1-3 of the module docstring; every process ends in the stack's close."""
    stack = LocalStack(workdir)
    try:
        fleet: RoutedFleet = await asyncio.to_thread(
            stack.start_routed_pods, args.router, 3, adapter=False,
            token_interval_ms=TOKEN_INTERVAL_MS)
        proxy_url, proxy_pid = await asyncio.to_thread(start_proxy, stack, fleet.router.url)
        await run_phase("warm", proxy_url, args.streams, 2.0, None)
        direct, proxy = Side([]), Side([])
        for i in range(args.rounds):
            order = ("direct", "proxy") if i % 2 == 0 else ("proxy", "direct")
            for side in order:
                if side == "direct":
                    direct.phases.append(await run_phase(
                        side, fleet.router.url, args.streams, args.seconds, None))
                else:
                    proxy.phases.append(await run_phase(
                        side, proxy_url, args.streams, args.seconds, proxy_pid))
        return direct, proxy
    finally:
        await stack.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.continuation_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", choices=("smg", "vllm-router"), default="smg")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2, help="phases per side")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-continuation-") as tmp:
        direct, proxy = asyncio.run(measure(args, Path(tmp)))
    print(report(direct, proxy, args))
    if direct.inexact() or proxy.inexact():
        print("VOID: some streams were not the engines' exact tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
