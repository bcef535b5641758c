from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model directory (config + tokenizer, no weights) shared by the session."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
