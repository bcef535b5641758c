"""Kill tiers written by hand (``--adopt-tier`` and its JSON form), as pure functions."""

from __future__ import annotations

import signal

import pytest

from coordinator.kill.policy import DEFAULT_TIER_TIMEOUT_S, TierSpec
from coordinator.tier_settings import TierSyntaxError, parse_tier, parse_tiers


@pytest.mark.parametrize(("text", "expected"), [
    ("w=VLLM::Worker", TierSpec("w", pattern="VLLM::Worker")),
    ("engine-core=VLLM::(EngineCore|DPCoordinator):30",
     TierSpec("engine-core", pattern="VLLM::(EngineCore|DPCoordinator)", timeout_s=30)),
    ("s=sglang::scheduler:2.5:SIGINT",
     TierSpec("s", pattern="sglang::scheduler", timeout_s=2.5, signal=signal.SIGINT)),
    ("main=sglang\\.launch_server:30:term:root",
     TierSpec("main", pattern="sglang\\.launch_server", timeout_s=30, include_root=True)),
    ("main=launch_server:root", TierSpec("main", pattern="launch_server", include_root=True)),
    ("x=a{1,2}:b", TierSpec("x", pattern="a{1,2}:b")),
    ("x=a:INT", TierSpec("x", pattern="a:INT")),
    ("x=port:80:5", TierSpec("x", pattern="port:80", timeout_s=5)),
])
def test_flag_form(text: str, expected: TierSpec) -> None:
    assert parse_tier(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("no-equals", "no '='"),
    ("=x", "tier name"),
    ("bad name=x", "tier name"),
    ("x=", "pattern is empty"),
    ("x=:5", "pattern is empty"),
    ("x=(:5", "is not a pattern RE2 accepts"),
    ("x=a:0", "timeout"),
    ("x=a:-1", "timeout"),
    ("x=a:nan", "timeout"),
    ("x=a:99999", "timeout"),
])
def test_flag_form_errors_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(TierSyntaxError, match=why) as caught:
        parse_tier(text)
    assert "NAME=REGEX" in str(caught.value)


def test_environment_forms() -> None:
    from_json = parse_tiers('[{"name": "main", "pattern": "launch", "include_root": true,'
                            ' "signal": "SIGINT", "timeout_s": 3}, "w=VLLM::Worker:4"]')
    assert from_json == [
        TierSpec("main", pattern="launch", include_root=True, signal=signal.SIGINT,
                 timeout_s=3),
        TierSpec("w", pattern="VLLM::Worker", timeout_s=4),
    ]
    from_lines = parse_tiers("a=x{1,2}:3\n\n  b=y:root\n")
    assert from_lines == [TierSpec("a", pattern="x{1,2}", timeout_s=3),
                          TierSpec("b", pattern="y", include_root=True)]
    assert parse_tiers("") == []
    assert parse_tiers([TierSpec("t", pattern="p")]) == [TierSpec("t", pattern="p")]
    assert parse_tiers(["t=p"])[0].timeout_s == DEFAULT_TIER_TIMEOUT_S


@pytest.mark.parametrize("text", [
    "[", '[{"name": "a"}]', '[{"name": "a", "pattern": "x", "colour": 1}]',
    '[{"name": "a", "pattern": "x", "timeout_s": "5"}]',
    '[{"name": "a", "pattern": "x", "signal": "SIGNOPE"}]',
    '[{"name": "a", "pattern": "x", "include_root": "yes"}]', "[3]",
])
def test_environment_errors(text: str) -> None:
    with pytest.raises(TierSyntaxError):
        parse_tiers(text)
