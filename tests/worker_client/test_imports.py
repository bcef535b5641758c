"""The engine-side and router-side libraries stay light: no coordinator, FastAPI or psutil."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("coordinator", "fastapi", "psutil", "starlette", "uvicorn", "pydantic")


def _modules_loaded_by(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    return {name.split(".")[0] for name in json.loads(out.stdout)}


@pytest.mark.parametrize(
    "statement",
    [
        "import worker_client",
        "from worker_client import WorkerClient, install_graceful_shutdown",
        "import router_client",
        "from router_client import Watcher",
        "import router_client.sse",
    ],
)
def test_import_loads_nothing_heavy(statement: str) -> None:
    """1. Import the library in a fresh interpreter.
    2. None of the service's modules (coordinator, FastAPI, psutil, Starlette, uvicorn,
       pydantic) got loaded."""
    loaded = _modules_loaded_by(statement)
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_public_surface() -> None:
    """1. Every name in ``worker_client.__all__`` exists."""
    import worker_client

    for name in worker_client.__all__:
        assert hasattr(worker_client, name), name
