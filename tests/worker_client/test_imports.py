"""worker_client's public surface and its shape. That it and router_client import nothing of
the service (every module, in a fresh interpreter with the service's dependencies blocked) is
tests/test_layering.py's."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import worker_client
from worker_client import errors

PACKAGE = Path(worker_client.__file__).parent

PUBLIC = {
    "WorkerClient", "install_graceful_shutdown", "GracefulShutdown", "Request", "TrackScope",
    "DrainNotice", "DrainObserver", "Tier", "handed_back_event", "process_start_time",
    "WorkerClientError", "InvalidSetting", "HandedBack", "ClientClosed", "NotRegistered",
    "CoordinatorError", "CoordinatorUnreachable", "StreamEnded", "ProtocolError",
    "CoordinatorRefused", "WorkerUnknown",
}
MAX_MODULE_LINES = 400
MAX_FACADE_LINES = 300


def test_public_surface() -> None:
    """1. ``__all__`` is exactly the names above (a new public name is a decision).
    2. Every one exists; every other module is private (``_name``) but ``errors``."""
    assert set(worker_client.__all__) == PUBLIC
    for name in worker_client.__all__:
        assert hasattr(worker_client, name), name
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert {m for m in modules if not m.startswith("_")} == {"errors"}


def test_every_exception_derives_from_the_base() -> None:
    """1. Every exception class of the package (public or not) is a WorkerClientError.
    2. Every one is drawn in the errors module's docstring."""
    classes: dict[str, type[BaseException]] = {}
    for path in PACKAGE.glob("*.py"):
        module = importlib.import_module(f"worker_client.{path.stem}")
        classes |= {obj.__qualname__: obj for obj in vars(module).values()
                    if inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__.startswith("worker_client")}
    assert "WorkerUnknown" in classes
    for name, cls in classes.items():
        assert issubclass(cls, errors.WorkerClientError), name
        drawn = f"── {name} " in (errors.__doc__ or "") or cls is errors.WorkerClientError
        assert drawn, name
    assert issubclass(errors.InvalidSetting, ValueError)  # callers catching ValueError


def test_modules_stay_small() -> None:
    """1. No module past MAX_MODULE_LINES; the client class's module under MAX_FACADE_LINES."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert max(sizes.values()) <= MAX_MODULE_LINES, sizes
    assert sizes["_client.py"] < MAX_FACADE_LINES, sizes["_client.py"]


def test_no_http_library_is_loaded() -> None:
    """1. In a fresh interpreter, import worker_client and build a client.
    2. No HTTP library (httpx, httpcore, h11, anyio) was loaded: the transport is the
    standard library's sockets."""
    probe = ("import sys, worker_client; worker_client.WorkerClient(None); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'httpx', 'httpcore', 'h11', 'anyio', 'requests', 'urllib3'}))")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent).stdout.strip()
    assert seen == "[]"
