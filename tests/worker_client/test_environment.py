"""``WorkerClient()`` takes its coordinator's URL and token from the variables every manifest
gives the engine container, so an engine written against the README runs unchanged in a
pod: ``SHUTDOWN_COORDINATOR_URL`` and the token in ``SHUTDOWN_COORDINATOR_TOKEN_FILE``."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker_client import InvalidSetting, WorkerClient


@pytest.fixture
def manifest_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_URL", "http://127.0.0.1:8787/")
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_TOKEN_FILE", str(token))
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_TOKEN", "not-this-one")
    return token


def test_left_out_they_come_from_the_manifests_variables(manifest_env: Path) -> None:
    """The URL from its variable; the token from the file, which wins over the variable
    holding a token; both reach the link's requests (its bearer header)."""
    client = WorkerClient(role="worker")
    assert client.coordinator_url == "http://127.0.0.1:8787"
    assert client._link._headers == {"Authorization": "Bearer s3cret"}


def test_given_they_win_and_none_says_none(manifest_env: Path) -> None:
    client = WorkerClient("http://10.0.0.1:9000", token="given")
    assert client.coordinator_url == "http://10.0.0.1:9000"
    assert client._link._headers == {"Authorization": "Bearer given"}
    alone = WorkerClient(None, token=None)
    assert alone.coordinator_url is None
    assert alone._link._headers == {}


def test_the_token_variable_serves_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHUTDOWN_COORDINATOR_TOKEN_FILE", raising=False)
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_TOKEN", "from-env")
    monkeypatch.delenv("SHUTDOWN_COORDINATOR_URL", raising=False)
    client = WorkerClient()
    assert client.coordinator_url is None  # no coordinator: the engine serves alone
    assert client._link._headers == {"Authorization": "Bearer from-env"}


def test_an_unreadable_token_file_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Serving on without the token would only show as 401s in the log and a pod that
    never migrates: the client refuses to start instead, naming the variable and file."""
    monkeypatch.setenv("SHUTDOWN_COORDINATOR_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(InvalidSetting, match=r"SHUTDOWN_COORDINATOR_TOKEN_FILE=.*missing: "
                                              r"cannot read the token"):
        WorkerClient()
