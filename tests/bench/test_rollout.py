"""The rollout benchmark cannot lie: what it counts is held against the engines' own records.

The first tests check the counting on made-up streams (no process); the last runs the
smallest real rollout (two pods behind the real ``smg``, drained through their coordinators,
the clients straight on smg or behind the continuation proxy) and holds every number of the
table against what each engine logged it took and how each request ended there
(``Pod.requests()``), so a client-side miscount, a request missed, or a token counted twice
shows. It needs the real router: marked ``engine``, it runs with the engine tests.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bench.rollout import STRATEGIES, Params, Result, proxy_installed, run_strategy
from bench.rollout_load import Received, tally
from bench.rollout_pods import Kube
from devstack import routers
from devstack.sim.tokens import expected_tokens
from tests.support.processes import ProcessJanitor


def received(tokens: list[str], end: str, *, n: int = 10, prompt: str = "p") -> Received:
    stream = Received("r", prompt, n, 0.0, end=end)
    stream.texts = list(tokens)
    stream.times = [0.01 * (i + 1) for i in range(len(tokens))]
    return stream


def test_a_whole_stream_counts_nothing_lost() -> None:
    want = expected_tokens("p", 10)
    counted = tally([received(want, "done")])
    assert (counted.done, counted.failed, counted.cut, counted.lost, counted.duplicated) == \
        (1, 0, 0, 0, 0)


def test_a_handed_back_stream_is_cut_and_its_rest_lost() -> None:
    want = expected_tokens("p", 10)
    counted = tally([received(want[:4], "handed_back"), received([], "handed_back")])
    assert (counted.cut, counted.failed, counted.lost, counted.duplicated) == (2, 0, 16, 0)


def test_a_refused_request_failed_and_lost_everything() -> None:
    counted = tally([received([], "error")])
    assert (counted.failed, counted.cut, counted.lost) == (1, 0, 10)


def test_a_stitched_stream_that_repeats_or_skips_is_caught_token_by_token() -> None:
    """A continuation that re-sends tokens 4-6, and one that skips token 7, both ending
    [DONE]: the first counts 3 duplicated, the second 1 lost; chunks that split or join
    tokens count the same as one chunk per token."""
    want = expected_tokens("p", 10)
    repeated = received([*want[:7], *want[4:]], "done")
    skipped = received([*want[:6], *want[7:]], "done")
    rechunked = received(["".join(want[:3]), *want[3:]], "done")
    assert repeated.damage() == (0, 3)
    assert skipped.damage() == (1, 0)
    assert rechunked.damage() == (0, 0)
    assert tally([repeated, skipped, rechunked]).cut == 0


def _attempts(result: Result) -> dict[str, list[dict[str, Any]]]:
    """The engines' records of each client request, in arrival order: one per attempt (the
    continuation proxy names its attempts ``ID.0``, ``ID.1``, ...)."""
    continued = result.strategy.continuation
    attempts: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(result.requests, key=lambda r: r["arrived_at_monotonic"]):
        rid = record["request_id"]
        attempts.setdefault(rid.rsplit(".", 1)[0] if continued else rid, []).append(record)
    return attempts


def _smallest_rollout(name: str, janitor: ProcessJanitor, tmp_path: Path) -> Result:
    if not routers.installed():
        pytest.skip("the routers are not installed: run scripts/engines.sh routers")
    strategy = next(s for s in STRATEGIES if s.name == name)
    if strategy.continuation and not proxy_installed():
        pytest.skip("the continuation proxy is not installed")
    params = Params(pods=2, clients=4, max_tokens=60, warmup_s=1.0, steady_s=2.0)
    return asyncio.run(run_strategy(strategy, params, Kube(), tmp_path, janitor.spawn))


@pytest.mark.engine
@pytest.mark.parametrize("name", ["coordinator", "continuation", "continuation-prestarted"])
def test_the_smallest_rollout_counts_what_the_engines_saw(name: str, janitor: ProcessJanitor,
                                                          tmp_path: Path) -> None:
    """1. Two pods behind the real smg, each with a coordinator told of it; four clients
       stream 60-token completions through smg (``coordinator``) or through the
       continuation proxy in front of it (``continuation``).
    2. A short steady state, then both pods replaced one after another (surge, Ready, the
       preStop hook's drain, SIGTERM), as the benchmark does.
    3. Every request the clients sent reached the engines, and no engine took a request
       nobody sent (the engines' own logs); straight through smg each exactly once.
    4. Each stream's end at the client is its end at the engines: straight through smg,
       ``done`` with exactly the expected tokens, or handed back after exactly as many
       tokens as the engine produced; through the proxy, every stream whole, its attempts
       handed back but the last, their tokens adding up to the stream's.
    5. The table's numbers add up to the engines' records: cut = the hand-backs that reached
       a client, lost = the tokens those did not produce, nothing failed or duplicated;
       every hand-back is in the rollout's numbers, none in the steady state's.
    6. Every process of the old pods exited on its own (no kubelet SIGKILL), the hooks
       returned 0, the old engines exited 0.
    7. The control with its coordinators started before (``continuation-prestarted``): each
       new pod's coordinator wrote its port file (as it started listening) before the
       rollout's first new pod started."""
    result = _smallest_rollout(name, janitor, tmp_path)
    strategy = result.strategy

    attempts = _attempts(result)
    sent = {s.request_id: s for s in result.sent}
    assert set(attempts) == set(sent), (set(attempts) ^ set(sent))
    handed = [r for r in result.requests if r["how"] == "handed_back"]
    assert handed, "no stream was in flight on a drained pod: the rollout measured nothing"
    for stream in result.sent:
        tried = attempts[stream.request_id]
        assert [r["how"] for r in tried] == ["handed_back"] * (len(tried) - 1) + [
            "done" if stream.end == "done" else "handed_back"], (stream.request_id, tried)
        if not strategy.continuation:
            assert len(tried) == 1, tried
            assert stream.tokens() == stream.expected()[:tried[0]["tokens"]]
            assert stream.end == ("done" if tried[0]["how"] == "done" else "handed_back")
        else:
            assert stream.end == "done", stream.error
            assert stream.tokens() == stream.expected()
            assert sum(r["tokens"] for r in tried) == stream.max_tokens, tried

    cut_at_client = [] if strategy.continuation else handed
    lost = sum(r["max_tokens"] - r["tokens"] for r in cut_at_client)
    whole = tally(result.sent)
    assert (whole.cut, whole.lost, whole.failed, whole.duplicated) == \
        (len(cut_at_client), lost, 0, 0)
    assert (result.rollout.cut, result.rollout.lost) == (len(cut_at_client), lost)
    assert (result.steady.cut, result.steady.lost) == (0, 0)

    assert all(not d.sigkilled for d in result.deletions), result.deletions
    assert {d.hook_exit for d in result.deletions} == {0}, result.deletions
    assert {d.engine_exit for d in result.deletions} == {0}, result.deletions

    if strategy.prestarted:  # step 7: by the coordinators' own port files
        offset = time.time() - time.monotonic()
        written = [(tmp_path / f"new{i}-coordinator.port.json").stat().st_mtime - offset
                   for i in range(2)]
        assert max(written) < result.surges[0][0], (written, result.surges)


@pytest.mark.engine
def test_the_proxied_sleep_wait_control_continues_nothing(janitor: ProcessJanitor,
                                                          tmp_path: Path) -> None:
    """The control ``sleep-wait-proxied``: the clients behind the continuation proxy, the pods
    without coordinators. By the engines' own logs, every request the clients sent was
    taken once and served whole (nothing to continue: the engines finish their streams on
    SIGTERM), no engine took a request nobody sent, and the table counts nothing lost."""
    result = _smallest_rollout("sleep-wait-proxied", janitor, tmp_path)
    attempts = _attempts(result)
    assert set(attempts) == {s.request_id for s in result.sent}
    assert all([r["how"] for r in tried] == ["done"] for tried in attempts.values()), attempts
    assert all(s.end == "done" and s.tokens() == s.expected() for s in result.sent)
    whole = tally(result.sent)
    assert (whole.cut, whole.lost, whole.failed, whole.duplicated) == (0, 0, 0, 0)
    assert {d.engine_exit for d in result.deletions} == {0}, result.deletions
    assert all(not d.sigkilled for d in result.deletions), result.deletions
