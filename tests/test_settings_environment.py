"""``Settings`` reads ``SHUTDOWN_COORDINATOR_<FIELD>`` itself: the name in any case, each
value validated as the field's own, and a value given to ``Settings(...)`` (a flag) wins."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coordinator.router_settings import RouterSpec
from coordinator.settings import ENV_PREFIX, Settings, from_environment


def test_fields_come_from_the_environment_in_any_case_and_a_given_value_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1. the port in lower case, lists as commas and as JSON, a router, a secret;
    2. the port given to ``Settings`` wins over the environment's;
    3. a variable of the prefix that names no field is ignored."""
    monkeypatch.setenv(ENV_PREFIX.lower() + "port", "9123")
    monkeypatch.setenv(ENV_PREFIX + "ADOPT_PATTERNS", "vllm, sglang")
    monkeypatch.setenv(ENV_PREFIX + "ADOPT_PIDS", "[12, 13]")
    monkeypatch.setenv(ENV_PREFIX + "ROUTERS", "smg=http://smg:30000")
    monkeypatch.setenv(ENV_PREFIX + "TOKEN", "s3cret")
    monkeypatch.setenv(ENV_PREFIX + "NO_SUCH_SETTING", "1")
    settings = Settings()
    assert settings.port == 9123
    assert settings.adopt_patterns == ["vllm", "sglang"]
    assert settings.adopt_pids == [12, 13]
    assert settings.routers == [RouterSpec(kind="smg", url="http://smg:30000")]
    assert settings.token is not None
    assert settings.token.get_secret_value() == "s3cret"
    assert Settings(port=8000).port == 8000


def test_a_bad_value_in_the_environment_is_refused_with_its_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PREFIX + "GRACE_PERIOD_S", "nan")
    with pytest.raises(ValidationError, match="grace_period_s"):
        Settings()


def test_only_the_prefixed_names_of_fields_are_read() -> None:
    environ = {"SHUTDOWN_COORDINATOR_HOST": "0.0.0.0", "HOST": "ignored",
               "shutdown_coordinator_Port": "1", "SHUTDOWN_COORDINATOR_": "x"}
    assert from_environment(environ, ["host", "port"]) == {"host": "0.0.0.0", "port": "1"}
