"""Deterministic tokens, knob parsing and knob matching (pure, no processes)."""

from __future__ import annotations

import argparse

import pytest

from devstack.sim import EngineKnobs, Role, expected_tokens
from devstack.sim.errors import SimArgumentError
from devstack.sim.roles import knob_matches
from devstack.sim.tokens import TokenStream


def test_tokens_are_deterministic_words() -> None:
    first = expected_tokens("The capital of France is", 20)
    assert first == expected_tokens("The capital of France is", 20)
    assert all(t.startswith(" ") and t[1:].isalpha() for t in first)
    assert first != expected_tokens("The capital of Spain is", 20)


@pytest.mark.parametrize("cut", [0, 1, 7, 19])
def test_continuing_with_the_text_so_far_yields_exactly_the_rest(cut: int) -> None:
    """1. Generate 20 tokens. 2. Restart from prompt + the first ``cut``. 3. Same rest."""
    prompt = "Once upon a time"
    whole = expected_tokens(prompt, 20)
    rest = expected_tokens(prompt + "".join(whole[:cut]), 20 - cut)
    assert whole[:cut] + rest == whole


def test_token_stream_matches_expected_tokens() -> None:
    stream = TokenStream("x")
    assert [stream.next_token() for _ in range(5)] == expected_tokens("x", 5)


def test_knobs_round_trip_through_the_command_line() -> None:
    knobs = EngineKnobs(
        schedulers=3,
        dp=2,
        teardown_s=1.5,
        ignore_sigterm=("scheduler:1",),
        fork_on_shutdown=("detokenizer", "scheduler"),
        watchdog=False,
        graceful_main=True,
        dp_no_propagate=True,
    )
    parser = argparse.ArgumentParser()
    EngineKnobs.add_arguments(parser)
    assert EngineKnobs.from_namespace(parser.parse_args(knobs.to_argv())) == knobs
    assert EngineKnobs().to_argv() == []


@pytest.mark.parametrize("spec", ["gpu", "scheduler:x", "main:"])
def test_knobs_reject_unknown_processes(spec: str) -> None:
    with pytest.raises(SimArgumentError):
        EngineKnobs(ignore_sigterm=(spec,))


def test_knob_matches_role_or_role_and_rank() -> None:
    assert knob_matches(["scheduler"], Role.SCHEDULER, 3)
    assert knob_matches(["scheduler:1"], Role.SCHEDULER, 1)
    assert not knob_matches(["scheduler:1"], Role.SCHEDULER, 0)
    assert not knob_matches(["detokenizer"], Role.SCHEDULER, 0)
    assert not knob_matches([], Role.MAIN)
